"""The task contract, shared by every package that makes, runs or trains on tasks.

    types    TaskInstance, ReferenceCall, VerifierSpec (pure data: what a task source
             hands to the episode loop), `is_workspace_relative`
    verify   the one verifier runner: `run_verifier(sandbox, task) -> VerifierOutcome`
             (files installed without following links, the output contract), `Verifier`

A floor just above `sandbox/` (docs/architecture.md): task sources (`suites/`) build
`TaskInstance`s, the episode loop (`agent/`) runs them and `run_verifier` scores them, so
neither needs the other. Submodules are imported explicitly.
"""
