"""MLflow tracking of training jobs: one parent run per job (curves live while it trains), one child run per
worker, the timing table, tables and figures, the resolved config, the model and the dataset. Nothing here imports
Prefect."""

from ntp.run.tracking.live import EpochLogger, ResultsFollower
from ntp.run.tracking.mlflow_store import (
    EXPERIMENT_KIND,
    TAG_ERROR,
    TAG_EXPERIMENT_KIND,
    TAG_FLOW_RUN,
    TAG_GIT,
    TAG_KIND,
    TAG_PARENT,
    UI_URL_ENV,
    client,
    data_dir,
    experiment_id,
    git_commit,
    run_url,
    tracking_uri,
    ui_url,
)
from ntp.run.tracking.plots import curves_figure, memory_figure, plot_curves, plot_memory, plot_workers, workers_figure
from ntp.run.tracking.runs import (
    MODEL_DIR,
    PLOTS_DIR,
    TABLES_DIR,
    TrainingRun,
    download_model,
    log_evaluation,
    run_store,
    start_training_run,
)
from ntp.run.tracking.tables import epoch_metrics, summarize, timing_table, worker_metrics, worker_summary
from ntp.run.tracking.tracked import TrackedTraining, default_run_name, train_tracked, train_untracked

__all__ = [
    "EXPERIMENT_KIND",
    "EpochLogger",
    "MODEL_DIR",
    "PLOTS_DIR",
    "ResultsFollower",
    "TABLES_DIR",
    "TAG_ERROR",
    "TAG_EXPERIMENT_KIND",
    "TAG_FLOW_RUN",
    "TAG_GIT",
    "TAG_KIND",
    "TAG_PARENT",
    "TrackedTraining",
    "TrainingRun",
    "UI_URL_ENV",
    "client",
    "curves_figure",
    "data_dir",
    "default_run_name",
    "download_model",
    "epoch_metrics",
    "experiment_id",
    "git_commit",
    "log_evaluation",
    "memory_figure",
    "plot_curves",
    "plot_memory",
    "plot_workers",
    "run_store",
    "run_url",
    "start_training_run",
    "summarize",
    "timing_table",
    "tracking_uri",
    "train_tracked",
    "train_untracked",
    "ui_url",
    "worker_metrics",
    "worker_summary",
    "workers_figure",
]
