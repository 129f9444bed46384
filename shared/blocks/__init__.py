"""Block types: what a step does. Flow control lives in the engine; actions register here."""
