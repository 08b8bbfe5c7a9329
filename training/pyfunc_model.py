"""MLflow models-from-code entry point: the logged model is this file plus its artifacts.

``mlflow.pyfunc.load_model`` executes it and calls ``load_context`` on the model it
sets, which reads the fitted recommender from the ``recommender`` artifact.
"""

from mlflow.models import set_model

from training.pyfunc import RecommenderModel

set_model(RecommenderModel())
