"""Training: datasets, recommenders, honest evaluation, MLflow tracking, a gated registry, batch scoring.

======================  =================================================================
module                  what it holds
======================  =================================================================
``data``                interactions from the offline store (time range) or any table;
                        weights per event type; matrices; time / per-user random splits
``models``              popularity (global, regional), item-kNN, EASE, ALS, LTR re-ranker
``metrics``             precision / recall / NDCG / MAP / hit rate / coverage @k (pure)
``evaluate``            ``evaluate(model, split, ks) -> dict``; tuning on a validation split
``features``            Feast ``get_historical_features`` for (user, item, timestamp) rows
``pyfunc``              every model as an MLflow pyfunc (models from code, signature)
``tracking``            the experiment, datasets, models, comparison table and plots
``registry``            aliases ``challenger`` / ``champion`` / ``previous`` and the gate
``scoring``             per-version recommendations in Redis, atomic live-version switch
``experiment``          one training run end to end (``shopstream train``, the notebook)
``sample``              small synthetic event sets for tests and demos
======================  =================================================================

``fit`` and ``evaluate`` are pure; the MLflow run is opened at the edge (the CLI or
the notebook), and :func:`training.experiment.run_training` logs into it. Training
never reads Kafka: it reads the offline store's Parquet files.
"""
