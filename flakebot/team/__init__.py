"""Team mode: the work queue, quotas and workers in PostgreSQL (db, queue, worker). May import deliver, pipeline."""
