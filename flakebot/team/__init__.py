"""Team mode: the work queue, quotas and workers in PostgreSQL (db, queue, worker). May import deliver, pipeline, validation (a job's request is checked as
the doors check their arguments)."""
