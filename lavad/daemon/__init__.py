"""The decision core (engine, cluster state, policies, metrics) and its shells."""
