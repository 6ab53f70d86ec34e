"""Errors of the training package.

TrainingError
├── SnapshotError          a dataset snapshot cannot be built or read
│   └── EmptySnapshot      the selection matched no usable episode
├── BaseModelError         the local tokenizer / model cannot be built
├── ChatTemplateError      a base's chat template cannot render protocol v1 (agentic GRPO)
├── TrainerError           a TRL trainer failed (bad dataset, bad config, runtime error)
│   ├── TrainingStopped    its flow was cancelled (Ctrl-C, SIGTERM, a UI cancel)
│   └── RolloutTokenError  an episode cannot be a token-exact GRPO rollout
│       ├── MissingTokenIds   a step recorded no prompt or completion ids
│       └── TokenPrefixError  a turn's prompt does not extend the previous turn's ids
├── RegistryError          checkpoint / training-run bookkeeping failed
│   └── CheckpointNotFound no checkpoint (or no files) under that id
├── DatasetSelectionError  the train parameters select nothing to train on
├── DatasetExportError     a snapshot cannot be exported as asked (format, directory)
├── MonitorWindowError     the production monitor was given no window, or two
├── AliasServingError      `epiflow models serve` cannot serve the alias's checkpoint
│   └── AliasNotServable   the alias is unset, or points at an external endpoint
└── RewardEnvironmentError a GRPO rollout's sandbox or verifier broke (never a reward)
"""

from __future__ import annotations

from core.errors import EpiflowError


class TrainingError(EpiflowError):
    """Base class of every training error."""


class SnapshotError(TrainingError):
    """A dataset snapshot cannot be built or read."""


class EmptySnapshot(SnapshotError):
    """The selection matched no usable episode for that dataset kind."""


class BaseModelError(TrainingError):
    """The local tokenizer or base model cannot be built or saved."""


class ChatTemplateError(TrainingError):
    """A base checkpoint's chat template cannot render protocol v1 for agentic GRPO (none, or
    one that drops the system or user turns, raises, or breaks token-exact turns:
    `training.protocol_template`). The input is wrong: running it again fails the same way."""

    retryable = False


class TrainerError(TrainingError):
    """A trainer failed: unusable dataset, invalid configuration or a runtime error."""


class TrainingStopped(TrainerError):
    """Training was stopped because its flow was cancelled (Ctrl-C, SIGTERM, a UI cancel)."""

    stopped = True


class RolloutTokenError(TrainerError):
    """An episode cannot be turned into a token-exact GRPO rollout. Names the episode and
    the step (`episode_id`, `step_index`); the ids are never re-tokenized from text to
    paper over it."""

    def __init__(self, message: str, *, episode_id: str, step_index: int) -> None:
        super().__init__(message)
        self.episode_id = episode_id
        self.step_index = step_index


class MissingTokenIds(RolloutTokenError):
    """A step recorded no prompt or completion token ids (the policy does not capture them),
    or its logprobs do not align with its completion ids."""


class TokenPrefixError(RolloutTokenError):
    """A turn's prompt ids do not start with the previous turn's prompt ids followed by its
    sampled completion ids: the policy re-rendered the history instead of extending it."""


class RegistryError(TrainingError):
    """Checkpoint or training-run bookkeeping failed."""


class CheckpointNotFound(RegistryError):
    """No checkpoint row, or no stored files, under that id."""


class DatasetSelectionError(TrainingError):
    """The train parameters do not select a dataset (none, or more than one, of dataset,
    run and QC run; an unknown QC run)."""


class DatasetExportError(TrainingError):
    """A snapshot cannot be exported as asked: an unknown format, or an output directory
    that is a file, not empty, or cannot be created."""


class MonitorWindowError(TrainingError):
    """The production monitor's window is not named once: neither or both of a run and a
    file, or an unknown file format."""

    retryable = False


class AliasServingError(TrainingError):
    """A model alias's checkpoint cannot be served: it cannot be fetched, or its
    `transformers serve` did not start (the message names its log)."""


class AliasNotServable(AliasServingError):
    """The alias was never set, or points at an external endpoint, not a checkpoint."""

    retryable = False


class RewardEnvironmentError(TrainingError):
    """A GRPO rollout could not be scored: its sandbox or its verifier broke.

    An environment problem, never the policy's: it is raised instead of being turned into
    a (failure) reward the model would learn from."""
