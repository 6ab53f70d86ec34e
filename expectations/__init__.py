"""The quality gate: versioned GX suites (`suites/*.json`) and the code that runs them.

Pure: trajectories (or polars frames) in, verdicts out; no SQL, no Prefect. Entry points:

- `expectations.gate.run_gate(trajectories, config=load_qc_config())` → `GateReport`
  (`config.settings.load_qc_config`, at the entry point)
- `expectations.gate.evaluate_features(features, config=...)` for prebuilt feature frames
- `expectations.report.render_markdown(report)` for the Prefect artifact
"""
