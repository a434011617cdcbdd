"""The model registry: the names ``run_all.py --models`` accepts, each one file under ``models/``.

Classes are imported on first use so that listing names or running POP never imports every model.
"""
from __future__ import annotations

import importlib

_REGISTRY = {
    "pop": "models.pop:Pop",
    "bprmf": "models.bprmf:BPRMF",
    "sasrec": "models.sasrec:SASRec",
    "sasrec-ce": "models.sasrec:SASRecCE",
    "bert4rec": "models.bert4rec:BERT4Rec",
    "bert4rec-1mask": "models.bert4rec:BERT4Rec1Mask",
    "ncf": "models.ncf:NCF",
    "fpmc": "models.fpmc:FPMC",
    "gru4rec": "models.gru4rec:GRU4Rec",
    "gru4rec+": "models.gru4rec_plus:GRU4RecPlus",
    "caser": "models.caser:Caser",
    "lstm": "models.lstm:LSTM",
    "lstm-rel": "models.lstm_relevance:LSTMRelevance",
    "bert4rec-rel": "models.bert4rec_relevance:BERT4RecRelevance",
}


def model_names() -> list[str]:
    return list(_REGISTRY)


def model_class(name: str):
    if name not in _REGISTRY:
        raise ValueError(f"unknown model {name!r}; valid models: {', '.join(_REGISTRY)}")
    module, attribute = _REGISTRY[name].split(":")
    return getattr(importlib.import_module(module), attribute)
