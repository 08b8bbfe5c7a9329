"""Parts of the streaming job (:mod:`pipelines.stream`): the online path and Real-time Mode."""
