"""Datasets: raw files -> interactions -> filtered, time-ordered sequences -> leave-one-out or temporal split.

>>> from recbench.datasets import LeaveOneOutSplit, TemporalSplit, load_dataset
>>> data = load_dataset("ml-1m", data_dir="/path/to/files")   # SequenceData
>>> split = LeaveOneOutSplit(data)
>>> timed = load_dataset("ml-100k", data_dir="/path/to/files", timed=True)   # from a file with times
>>> split = TemporalSplit.at_quantiles(timed, (0.8, 0.9))

``python -m datasets --help`` lists every dataset and the files it accepts.

See ``registry.py`` for the datasets and their sources, ``preprocess.py`` for the preprocessing steps,
``loader.py`` for file lookup, downloads and caching, ``synthetic.py`` for generated data, ``logs.py`` for
interaction logs of the user's own (a CSV/TSV file or a DataFrame):

>>> data = load_log(InteractionLog("clicks.csv", LogFormat(user="uid", item="iid", time="ts")), "clicks")
"""
from recbench.datasets.errors import ChecksumError, DatasetFormatError, DownloadError, MissingDataError
from recbench.datasets.loader import (
    CACHE_DIR_ENV,
    DATA_DIR_ENV,
    dataset_on_disk,
    load_dataset,
    load_log,
    resolve_cache_dir,
    resolve_data_dir,
)
from recbench.datasets.logs import InteractionLog, LogFormat, log_entries, log_format
from recbench.datasets.preprocess import Preprocessing, prepare
from recbench.datasets.readers import FORMATS, Interactions, read_interactions
from recbench.datasets.registry import DATASET_NAMES, PAPER_DATASETS, URLS, dataset_names
from recbench.datasets.sequences import Histories, LeaveOneOutSplit, SequenceData
from recbench.datasets.splits import SplitSpec, TemporalSplit
from recbench.datasets.synthetic import generate

__all__ = [
    "load_dataset", "dataset_on_disk", "DATASET_NAMES", "PAPER_DATASETS", "dataset_names", "URLS",
    "resolve_data_dir", "resolve_cache_dir", "DATA_DIR_ENV", "CACHE_DIR_ENV",
    "read_interactions", "FORMATS", "Interactions", "prepare", "Preprocessing", "generate",
    "SequenceData", "LeaveOneOutSplit", "TemporalSplit", "SplitSpec", "Histories",
    "DatasetFormatError", "MissingDataError", "DownloadError", "ChecksumError",
    "InteractionLog", "LogFormat", "load_log", "log_entries", "log_format",
]
