"""Display names and the paper's orderings for models, datasets, metrics, ablation rows and sweep parameters.

Registry names (``bert4rec``, ``ml-1m``, ``NDCG@10``) are what results store; the paper's spelling and order are
what tables and figures show. Names this module does not know keep their registry spelling and are placed after
the known ones, so a new model or dataset shows up in every table without a code change.
"""
from __future__ import annotations

import re
from typing import Iterable

from recbench.benchmarks.metrics import is_list_metric

# Paper Table 2 order (baselines, then BERT4Rec); the 1-mask variant sits next to BERT4Rec as in Table 3.
MODELS = {
    "pop": "POP",
    "bprmf": "BPR-MF",
    "ncf": "NCF",
    "fpmc": "FPMC",
    "gru4rec": "GRU4Rec",
    "gru4rec+": "GRU4Rec+",
    "caser": "Caser",
    "sasrec": "SASRec",
    "sasrec-ce": "SASRec-CE",
    "gsasrec": "gSASRec",
    "sasrec-ss": "SASRec-SS",
    "lstm": "LSTM",
    "lstm-rel": "LSTM (relevance)",
    "bert4rec-1mask": "BERT4Rec (1 mask, last)",
    "bert4rec-1mask-random": "BERT4Rec (1 mask, random)",
    "bert4rec": "BERT4Rec",
    "gbert4rec": "gBERT4Rec",
    "bert4rec-rel": "BERT4Rec (relevance)",
}
BERT4REC = "bert4rec"
# Variants of BERT4Rec itself: never "the best baseline" that BERT4Rec is compared with.
BERT4REC_FAMILY = {"bert4rec", "bert4rec-1mask", "bert4rec-1mask-random", "gbert4rec", "bert4rec-rel"}

# Paper Table 1 order.
DATASETS = {"beauty": "Beauty", "steam": "Steam", "ml-1m": "ML-1m", "ml-20m": "ML-20m"}

# Ranking metrics are families with a cut-off; MRR has none. Relevance metrics follow.
METRIC_FAMILIES = ("HR", "NDCG", "MRR")
RELEVANCE_METRICS = {"accuracy": "Accuracy", "AUC": "AUC", "log_loss": "Log-loss"}
# Metrics where a lower value is better (all ranking metrics are higher-is-better).
LOWER_IS_BETTER = {"log_loss"}

# Paper Table 5 row order, then §4.8's w/o RC with L = 4; labels are compared case-insensitively ("w/o dropout"
# == "w/o Dropout").
ABLATION_VARIANTS = ("default", "w/o PE", "w/o PFFN", "w/o LN", "w/o RC", "w/o Dropout",
                     "L=1", "L=3", "L=4", "h=1", "h=4", "h=8", "w/o RC, L=4")

# Axis labels with units for the sensitivity sweeps (paper Figs. 3-5); unknown parameters use their own name.
SWEEP_PARAMS = {
    "hidden": "hidden size d (dimensions)",
    "mask_proportion": "mask proportion ρ (fraction of items)",
    "mask_prob": "mask proportion ρ (fraction of items)",
    "max_len": "maximum sequence length N (items)",
}

# Sweeps over sizes that roughly double from point to point read best on a log axis.
LOG_SWEEPS = {"hidden", "max_len"}

PROTOCOLS = ("full", "pop100", "uni100")
SPLITS = ("leave-one-out", "temporal")  # the paper's first
SPLIT_NAMES = {"leave-one-out": "leave-one-out", "temporal": "global temporal"}
PROTOCOL_NAMES = {
    "full": "full ranking over all items",
    "pop100": "100 popularity-sampled negatives",
    "uni100": "100 uniformly sampled negatives",
    "pairs": "relevance pairs: one positive and one sampled negative candidate per user",
}


def model_name(model: str) -> str:
    return MODELS.get(model, model)


def device_name(device: object) -> str:
    """A row's recorded device as tables and figures print it. Rows written before the provenance's grammar was
    fixed say "cpu (1 threads, ..."; the stored text stays as recorded, the reports say "1 thread"."""
    return re.sub(r"\(1 threads\b", "(1 thread", str(device)) if device else "device not recorded"


def dataset_name(dataset: str) -> str:
    return DATASETS.get(dataset, dataset)


def metric_name(metric: str) -> str:
    return RELEVANCE_METRICS.get(metric, metric)


def _ordered(names: Iterable[str], known: Iterable[str]) -> list[str]:
    """Known names in their canonical order, then the others alphabetically."""
    names = set(names)
    known = list(known)
    return [n for n in known if n in names] + sorted(names - set(known))


def order_models(models: Iterable[str]) -> list[str]:
    return _ordered(models, MODELS)


def order_datasets(datasets: Iterable[str]) -> list[str]:
    return _ordered(datasets, DATASETS)


def order_protocols(protocols: Iterable[str]) -> list[str]:
    return _ordered(protocols, PROTOCOLS)


def split_name(split: str) -> str:
    return SPLIT_NAMES.get(split, split)


def order_splits(splits: Iterable[str]) -> list[str]:
    return _ordered(splits, SPLITS)


def _metric_key(metric: str) -> tuple:
    match = re.fullmatch(r"([A-Za-z]+)@(\d+)", metric)
    family, cutoff = (match.group(1), int(match.group(2))) if match else (metric, 0)
    rank = METRIC_FAMILIES.index(family) if family in METRIC_FAMILIES else len(METRIC_FAMILIES)
    return rank, family, cutoff


def order_metrics(metrics: Iterable[str]) -> list[str]:
    """HR@k by k, then NDCG@k by k, then MRR, then anything else alphabetically."""
    return sorted(set(metrics), key=_metric_key)


def accuracy_metrics(metrics: Iterable[str]) -> list[str]:
    """:func:`order_metrics` without the beyond-accuracy metrics of the top-k lists, which describe the lists
    rather than the target's rank and have a table of their own (``reports.splits``)."""
    return order_metrics(m for m in metrics if not is_list_metric(m))


def canonical_variant(label: str) -> str:
    """The paper's spelling of an ablation label, matched case- and space-insensitively."""
    squeezed = label.replace(" ", "").lower()
    for known in ABLATION_VARIANTS:
        if known.replace(" ", "").lower() == squeezed:
            return known
    return label


def order_variants(labels: Iterable[str]) -> list[str]:
    return _ordered((canonical_variant(label) for label in labels), ABLATION_VARIANTS)


def sweep_label(param: str) -> str:
    return SWEEP_PARAMS.get(param, param)


# What an ablation row (benchmarks/commands/studies.py) removes where the paper names only the component, as the model
# code (models/transformer.py) does it; per model family where the families differ.
ABLATION_REMOVES: dict[str, str | dict[str, str]] = {
    "w/o PE": "the learnable positional embedding P (§3.4)",
    "w/o PFFN": "each block's position-wise feed-forward sub-layer with its dropout, residual and LayerNorm",
    "w/o LN": {"bert4rec": "all 2L + 2 LayerNorms: the embedding's, the two of each block (eq. 5) and the output "
                           "head's (after GELU(h W^P + b^P))",
               "sasrec": "all 2L + 1 LayerNorms: each block's two (queries, FFN input) and the final one"},
    "w/o RC": "both residual connections of every block (the embedding and the output head have none)",
    "w/o Dropout": "every dropout: embeddings, sub-layer outputs and attention probabilities",
    "w/o RC, L=4": "§4.8: both residual connections of every block, with L = 4 blocks",
}


def ablation_removes(model: str, label: str) -> str | None:
    """What ablation row ``label`` removes from ``model`` (:data:`ABLATION_REMOVES`), None where it is plain."""
    text = ABLATION_REMOVES.get(label)
    return text.get(model.split("-")[0]) if isinstance(text, dict) else text
