-- Retention of fired debounce bursts (shared/sweep/retention.py): found through this partial
-- index, oldest first, once their run is gone (the run's scope reads its burst's events).
CREATE INDEX debounce_bursts_fired ON debounce_bursts (fired_at) WHERE status = 'fired';
