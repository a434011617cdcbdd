"""The model registry: the names ``run_all.py --models`` accepts, each one file under ``models/``.

Classes are imported on first use so that listing names or running POP never imports every model.
"""
from __future__ import annotations

import importlib

_REGISTRY = {
    "pop": "recbench.models.pop:Pop",
    "bprmf": "recbench.models.bprmf:BPRMF",
    "sasrec": "recbench.models.sasrec:SASRec",
    "sasrec-ce": "recbench.models.sasrec:SASRecCE",
    "bert4rec": "recbench.models.bert4rec:BERT4Rec",
    "bert4rec-1mask": "recbench.models.bert4rec:BERT4Rec1Mask",
    "bert4rec-1mask-random": "recbench.models.bert4rec:BERT4Rec1MaskRandom",
    "ncf": "recbench.models.ncf:NCF",
    "fpmc": "recbench.models.fpmc:FPMC",
    "gru4rec": "recbench.models.gru4rec:GRU4Rec",
    "gru4rec+": "recbench.models.gru4rec_plus:GRU4RecPlus",
    "caser": "recbench.models.caser:Caser",
    "lstm": "recbench.models.lstm:LSTM",
    "lstm-rel": "recbench.models.lstm_relevance:LSTMRelevance",
    "bert4rec-rel": "recbench.models.bert4rec_relevance:BERT4RecRelevance",
}


def model_names() -> list[str]:
    return list(_REGISTRY)


def model_class(name: str):
    if name not in _REGISTRY:
        raise ValueError(f"unknown model {name!r}; valid models: {', '.join(_REGISTRY)}")
    module, attribute = _REGISTRY[name].split(":")
    return getattr(importlib.import_module(module), attribute)
