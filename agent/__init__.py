"""The agent: tool-call protocol v1, policies, the episode loop and the `Trajectory` types.

    trajectory    Trajectory, Step and friends (pure data, shared with storage/scoring)
    protocol      parse one assistant message (text protocol v1)
    native_calls  map native OpenAI `tool_calls` to the same parsed call
    coerce        arg text → the tool schema's types
    render        calls, finals and observations as text
    prompt        the system prompt (rules + tool schemas)
    policies/     scripted (oracle, noisy, idle), openai-compatible endpoints, local HF checkpoints
    loop          run_episode: one episode in one sandbox → a complete Trajectory (verified
                  by `tasks.verify.run_verifier`)
    recording     the record points of a step
    export, atif  ATIF and OpenAI chat-message export/import
    settings      LoopSettings, PolicySettings, NoisyRates (env prefix EPIFLOW_AGENT_)
    errors        the error tree

Submodules are imported explicitly (`from agent.loop import run_episode`); importing
`agent` itself loads nothing heavy. The protocol is specified in docs/protocol.md.
"""
