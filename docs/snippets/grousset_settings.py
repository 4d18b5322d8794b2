"""Configuration page: a ``GROUSSET`` dict in Django settings."""

# --8<-- [start:settings]
GROUSSET = {
    "PROCESSOR_ID": "billing",
    "MAX_PROCESSING_TIME": 120,  # a default for tasks that set none
    "EXPIRES_AFTER": 14 * 24 * 3600,
}
# --8<-- [end:settings]
