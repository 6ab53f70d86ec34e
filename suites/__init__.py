"""Task suites: seeded task instances with in-sandbox verifiers (see docs/suites.md).

Public API:

- `suites.registry.load_suite(name, *, settings, sandbox) -> Suite` — `"builtin"`,
  the example suites in `suites/examples/`, and user suites on `EPIFLOW_SUITES_PATH` (static
  or generated: seeded `params` and generator scripts run in nsjail, see `suites.user_suite`),
  found with the entry point's `SuitesSettings` (generators jailed with its `SandboxSettings`);
  `suites.builtin.builtin_suite()` is the built-in suite alone.
- `Suite.templates`, `Suite.generate(template, seed)`, `Suite.instances(n, seed=…)`,
  `Suite.heldout_instances(n, seed=…)` (evaluation seeds, disjoint from training seeds).
- the `TaskInstance`s they build and the verifier runner live in `tasks/` (the task contract:
  `tasks.types`, `tasks.verify.run_verifier`), a floor below, shared with the agent loop.
- `suites.curriculum.success_rates(...)`, `select_band(...)` — the 30–70 % band.
- `suites.check.summarize(...)`, `replay_reference(...)` — behind `epiflow suites check`.
"""
