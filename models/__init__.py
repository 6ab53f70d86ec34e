"""The SQL contract data engineers query: one SQLModel table per module.

Importing this package registers every table on `SQLModel.metadata` (Alembic's target).
"""

from models.artifact import Artifact
from models.checkpoint import Checkpoint
from models.collection_run import CollectionRun, run_id_for
from models.dataset import Dataset
from models.dataset_episode import DatasetEpisode
from models.episode import Episode
from models.episode_link import AtifDocument, EpisodeLink
from models.grpo_rollout import GrpoRollout
from models.harbor import HarborEpisode, HarborTest
from models.judgement import Judgement
from models.model_alias import ModelAliasChange
from models.policy import Policy
from models.qc_result import QcResult
from models.qc_run import QcRun
from models.replay_result import ReplayResult
from models.step import Step
from models.task import Task
from models.training_run import TrainingRun

__all__ = [
    "Artifact",
    "AtifDocument",
    "Checkpoint",
    "CollectionRun",
    "Dataset",
    "DatasetEpisode",
    "Episode",
    "EpisodeLink",
    "GrpoRollout",
    "HarborEpisode",
    "HarborTest",
    "Judgement",
    "ModelAliasChange",
    "Policy",
    "QcResult",
    "QcRun",
    "ReplayResult",
    "Step",
    "Task",
    "TrainingRun",
    "run_id_for",
]
