"""Scoring: rewards and returns, the rubric judges (rules + LLM/GRM), quality scores.

Pure logic over `agent.trajectory.Trajectory`; no SQL, no Prefect. Entry points:

- `scoring.rewards.apply_rewards(trajectory, RewardSettings())`
- `scoring.rule_judge.judge_trajectory(trajectory, RuleJudgeSettings())`
- `scoring.grm.GrmJudge(GrmSettings(...)).judge(trajectory)`
- `scoring.quality.quality_score(...)`, `scoring.quality.should_trigger_training(...)`
"""
