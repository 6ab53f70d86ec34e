"""epiflow as the environment of other trainers: client-driven episode sessions.

A session is one episode of the one episode loop (`agent.loop.run_episode`) whose
assistant turns come from a client instead of a model: `sessions.py` (the channel each
turn goes through, and the policy that routes the loop's requests to it), `hub.py` (one
collection run serving sessions as they arrive, through `Collection.run`), `server.py`
(OpenEnv's protocol over `WS /ws`), `trainer_env.py` (`EpiflowEnv` for TRL's
`environment_factory`, in-process).
"""
