"""MLflow tracking of training jobs: one parent run per job (curves live while it trains), one child run per
worker, the timing table, plots, the resolved config, the model and the dataset. Nothing here imports Prefect."""
from ntp.run.tracking.live import EpochLogger, ResultsFollower
from ntp.run.tracking.mlflow_store import (TAG_ERROR, TAG_FLOW_RUN, TAG_GIT, TAG_KIND, TAG_PARENT, client, data_dir,
                                           experiment_id, git_commit, run_url, tracking_uri)
from ntp.run.tracking.plots import plot_curves, plot_workers
from ntp.run.tracking.runs import (MODEL_DIR, TrainingRun, download_model, log_evaluation, run_store,
                                   start_training_run)
from ntp.run.tracking.tables import epoch_metrics, summarize, timing_table, worker_metrics
from ntp.run.tracking.tracked import TrackedTraining, default_run_name, train_tracked, train_untracked

__all__ = ["EpochLogger", "MODEL_DIR", "ResultsFollower", "TAG_ERROR", "TAG_FLOW_RUN", "TAG_GIT", "TAG_KIND",
           "TAG_PARENT", "TrackedTraining", "TrainingRun", "client", "data_dir", "default_run_name",
           "download_model", "epoch_metrics", "experiment_id", "git_commit", "log_evaluation", "plot_curves", "plot_workers", "run_store", "run_url",
           "start_training_run", "summarize", "timing_table", "tracking_uri", "train_tracked", "train_untracked",
           "worker_metrics"]
