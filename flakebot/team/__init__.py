"""Team mode: one server many agents share; crafts queued, deduplicated and spread over workers."""
