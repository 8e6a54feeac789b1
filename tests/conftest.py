import os

from hypothesis import HealthCheck, settings

# Bounded examples and no deadline (the first call of a Numba kernel compiles).
# HYPOTHESIS_PROFILE=thorough explores more; CI uses the default "ci" profile.
settings.register_profile("ci", max_examples=12, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("thorough", max_examples=200, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
