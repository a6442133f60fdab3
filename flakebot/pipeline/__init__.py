"""Runs and the machinery that drives them through their stages.

    engine.py   Stage, StageContext, execute/start/resume: the ordered stages, checkpoints, events
    run.py      a Run: its directory, state.json (versioned, atomic), the run lock, resources
    request.py  RunRequest: what the caller asked of a run, built by the CLI, the MCP server or the API
    cleanup.py  what clean removes from a run directory, and `flakebot clean`
    models.py   the run's model for a stage (one transcript, one budget across stages and resumes)
    jobs.py     long MCP calls' jobs: admission (max_jobs, max_session_jobs) and identity (pid + start time)
    heartbeat.py a heartbeat event while a step is long, naming what the run waits on (events.waiting_on)

May import flakebot.config, errors, events, fsutil, llm (models.py only). Never stages/ (they import this).
"""
