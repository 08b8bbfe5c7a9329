"""The HTTP API: dependencies (:mod:`serving.api.deps`) and one router per resource."""
