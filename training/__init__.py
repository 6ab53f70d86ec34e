"""Training: dataset snapshots, a locally built base model, TRL trainers, the checkpoint registry.

Modules (one concept each):

- `settings`: `TrainingSettings`, every knob with seed 000 §4.4 defaults.
- `conversations`: trajectories rendered exactly as the episode loop showed them.
- `builders`: pure row builders per dataset kind (sft, dpo, kto, grpo, distill, cpt).
- `snapshots`: select episodes in SQL, write the parquet snapshot and its lineage rows.
- `base_model`: a tokenizer trained on the protocol corpus and a tiny Qwen2-style model.
- `trainers`: `run_training(algo, …)` over TRL (SFT, DPO, KTO, GRPO).
- `rewards`: GRPO reward functions (protocol validity, sandbox + verifier).
- `training_config`: the training config (`training_config.json`) stored with every checkpoint.
- `registry`: `training_run` / `checkpoint` rows and model directories in the object store.
- `evaluation`: a checkpoint as an `hf:` policy on held-out tasks in real sandboxes.
"""
