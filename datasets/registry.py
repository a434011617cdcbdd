"""Every dataset the suite knows: where its files come from, how to parse them and how to filter them.

A paper dataset has up to three kinds of source, tried in this order by ``source="auto"``:

- ``authors``: the preprocessed ``user item`` file the BERT4Rec (or SASRec) authors published;
- ``sequences``: a third party's time-ordered sequences of the full raw data (staged ML-1m file);
- ``raw``: the upstream ratings/reviews file, preprocessed here.

Filter choices (see ``preprocess.py`` for the fixed steps), following ``PAPER.md``, "Datasets":

- authors' files: users >= 5 only. It is a no-op on their Beauty/ML-1m files (already filtered) and keeps
  the published data as is; on SASRec's Video file (which has users with 1-2 actions) it applies the
  paper's "users with at least 5 interactions" rule, which leave-one-out needs anyway (>= 3).
- ML-1m (full sequences or ratings.dat) and ML-100K: items >= 5, then users >= 5: the BERT4Rec/SASRec
  ML-1m preprocessing, which gives exactly 6,040 users / 3,416 items / 999,611 actions.
- ML-20m ratings.csv: users >= 5 only. Table 1's 26,744 items is every rated ML-20M movie, so the authors
  applied no item filter there (with one, about 18.3k items would remain).
- Amazon Beauty ratings: users >= 5 only: the authors' file keeps 37,501 items seen fewer than 5 times.
- Steam reviews: items >= 5, then users >= 5. Table 1's 13,044 items is close to SASRec's 5-core Steam
  (13,047), so an item filter was applied; the exact BERT4Rec Steam recipe is not published and these
  counts cannot be checked offline.

``URLS`` maps ``"<dataset>/<kind>"`` to the download address; tests point it at a local server.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from recbench.datasets.errors import unknown
from recbench.datasets.preprocess import Preprocessing
from recbench.datasets.readers import TIMED_FORMATS

GITHUB_BERT4REC = "https://raw.githubusercontent.com/FeiSun/BERT4Rec/master/data"
GROUPLENS = "https://files.grouplens.org/datasets/movielens"
URLS: dict[str, str] = {
    "beauty/authors": f"{GITHUB_BERT4REC}/beauty.txt",
    "beauty/raw": "https://snap.stanford.edu/data/amazon/productGraph/categoryFiles/ratings_Beauty.csv",
    "steam/authors": f"{GITHUB_BERT4REC}/steam.txt",
    "steam/raw": "https://cseweb.ucsd.edu/~wckang/steam_reviews.json.gz",
    "ml-1m/authors": f"{GITHUB_BERT4REC}/ml-1m.txt",
    "ml-1m/raw": f"{GROUPLENS}/ml-1m.zip",
    "ml-20m/authors": f"{GITHUB_BERT4REC}/ml-20m.zip",
    "ml-20m/raw": f"{GROUPLENS}/ml-20m.zip",
    "ml-100k/raw": f"{GROUPLENS}/ml-100k.zip",
    "ml-latest-small/raw": f"{GROUPLENS}/ml-latest-small.zip",
    "video/authors": "https://raw.githubusercontent.com/kang205/SASRec/master/data/Video.txt",
}

USERS_ONLY = Preprocessing(min_item_interactions=0, min_user_interactions=5)
ITEMS_THEN_USERS = Preprocessing(min_item_interactions=5, min_user_interactions=5)


@dataclass(frozen=True)
class Source:
    """One way to obtain a dataset: local file names to look for, format, filters, download checksum."""

    kind: str  # "authors", "sequences" or "raw"
    fmt: str  # a readers.FORMATS name
    files: tuple[str, ...]  # upstream and staged names under the data directory; "<name>.gz" also accepted
    description: str
    preprocessing: Preprocessing
    members: tuple[str, ...] = ()  # glob patterns of the data member inside a .zip
    sha256: str | None = None  # of the file at the download URL, where published or independently confirmed

    @property
    def timed(self) -> bool:
        """Whether the source's file keeps each interaction's time (the authors' files keep only the order)."""
        return self.fmt in TIMED_FORMATS


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    description: str
    sources: tuple[Source, ...]  # in "auto" preference order

    def url(self, source: Source) -> str | None:
        return URLS.get(f"{self.name}/{source.kind}")

    def accepted_files(self, sources: tuple[Source, ...] | list[Source] | None = None) -> list[str]:
        """One line per source: the file names accepted under the data directory and where they come from."""
        lines = []
        for source in self.sources if sources is None else sources:
            names = " or ".join(name + (f" (holding {' or '.join(source.members)})" if name.endswith(".zip")
                                        else f" (or {name}.gz)") for name in source.files)
            url = self.url(source)
            lines.append(f"[{source.kind}] {names}: {source.description}"
                         + ("; with interaction times (--split temporal)" if source.timed else "")
                         + (f"; from {url}" if url else "; not downloadable"))
        return lines


@dataclass(frozen=True)
class SyntheticSpec:
    name: str
    description: str
    params: dict = field(default_factory=dict)  # keyword arguments of synthetic.generate


def _authors(name: str, file: str, sha256: str | None = None, **kwargs) -> Source:
    return Source("authors", "user-item", (file,), f"{name} preprocessed by the paper's authors ({file})",
                  USERS_ONLY, sha256=sha256, **kwargs)


_SPECS = (
    DatasetSpec("beauty", "Amazon Beauty (BERT4Rec Table 1: 40,226 users, 54,542 items, 0.35m actions)", (
        _authors("Beauty", "beauty.txt", "f480b7a7403852342ffd8f9809bb30697dd669be31813d0e204b698fec86ef49"),
        Source("raw", "amazon-csv", ("ratings_Beauty.csv",),
               "Amazon product data 2014, Beauty ratings only (McAuley et al.)", USERS_ONLY),
    )),
    DatasetSpec("steam", "Steam reviews (BERT4Rec Table 1: 281,428 users, 13,044 items, 3.5m actions)", (
        _authors("Steam", "steam.txt"),
        Source("raw", "steam-json", ("steam_reviews.json",),
               "Steam reviews (Kang & McAuley 2018), one Python-literal dict per line", ITEMS_THEN_USERS),
    )),
    DatasetSpec("ml-1m", "MovieLens 1M (BERT4Rec Table 1: 6,040 users, 3,416 items, 1.0m actions)", (
        _authors("ML-1m", "ml-1m.txt", "b725f3acb3986fe3130bffd1e77a74d182a1f51799567a236dbd60270f95b0a2"),
        Source("sequences", "user-item", ("ml-1m_seq_full.txt",),
               "every ML-1M rating, time-ordered per user, original ids (BERT4Rec-VAE-Pytorch preprocessing); the "
               "same interactions as the authors' ml-1m.txt, but not its order among a user's same-second ratings: on "
               "the authors' first 12 users 412 of 1,549 positions (27%) hold another item, none moved more than 6 "
               "places, and for one of the 12 both the validation and the test item differ; the authors' ml-1m.txt, "
               "where present, is read instead",
               ITEMS_THEN_USERS),
        Source("raw", "ml-dat", ("ml-1m.zip", "ml-1m/ratings.dat"), "GroupLens MovieLens 1M ratings.dat",
               ITEMS_THEN_USERS, members=("ml-1m/ratings.dat",),
               sha256="a6898adb50b9ca05aa231689da44c217cb524e7ebd39d264c56e2832f2c54e20"),
    )),
    DatasetSpec("ml-20m", "MovieLens 20M (BERT4Rec Table 1: 138,493 users, 26,744 items, 20m actions)", (
        _authors("ML-20m", "ml-20m.zip", members=("*.txt",)),
        Source("raw", "ml-csv", ("ml-20m.zip", "ml-20m/ratings.csv"), "GroupLens MovieLens 20M ratings.csv",
               USERS_ONLY, members=("ml-20m/ratings.csv",),
               sha256="96f243c338a8665f6bcc89c53edf6ee39162a846940de6b7c8c48aeada765ff3"),
    )),
    DatasetSpec("ml-100k", "MovieLens 100K (not in the paper; ML-1m's filters)", (
        Source("raw", "udata", ("ml-100k.zip", "ml-100k/u.data", "ml-100k_u.data"),
               "GroupLens MovieLens 100K u.data", ITEMS_THEN_USERS, members=("ml-100k/u.data",),
               sha256="50d2a982c66986937beb9ffb3aa76efe955bf3d5c6b761f4e3a7cd717c6a3229"),
    )),
    DatasetSpec("ml-latest-small", "MovieLens latest-small (not in the paper; ML-20m's ratings.csv format)", (
        # No checksum: GroupLens updates the "latest" files in place.
        Source("raw", "ml-csv", ("ml-latest-small.zip", "ml-latest-small/ratings.csv",
                                 "ml-latest-small_ratings.csv"),
               "GroupLens MovieLens latest-small ratings.csv", USERS_ONLY,
               members=("ml-latest-small/ratings.csv",)),
    )),
    DatasetSpec("video", "Amazon Video Games as preprocessed by the SASRec authors (not in the BERT4Rec paper)", (
        Source("authors", "user-item", ("Video.txt",), "Video Games preprocessed by the SASRec authors",
               USERS_ONLY, sha256="b7376fe24430743f411dc7f567285657b2adb3f74361cc7ba0aee94f3024b651"),
    )),
)
_SYNTHETIC = (
    SyntheticSpec("synthetic", "small generated data with popularity, user taste and item-to-item transitions "
                               "(datasets/synthetic.py), for quick runs and tests",
                  dict(n_users=1000, n_items=500, mean_length=30.0, seed=0)),
    SyntheticSpec("synthetic-steam", "synthetic at Steam's Table 1 size, for scale tests",
                  dict(n_users=281_428, n_items=13_044, mean_length=12.4, seed=0)),
    SyntheticSpec("synthetic-ml-20m", "synthetic at ML-20m's Table 1 size, for scale tests",
                  dict(n_users=138_493, n_items=26_744, mean_length=144.4, seed=0)),
)
REGISTRY: dict[str, DatasetSpec | SyntheticSpec] = {spec.name: spec for spec in (*_SPECS, *_SYNTHETIC)}

DATASET_NAMES = tuple(REGISTRY)
PAPER_DATASETS = ("beauty", "steam", "ml-1m", "ml-20m")


def dataset_names() -> list[str]:
    """All dataset names, the paper's four first."""
    return list(DATASET_NAMES)


def get_spec(name: str) -> DatasetSpec | SyntheticSpec:
    try:
        return REGISTRY[name]
    except KeyError:
        raise unknown("dataset", name, DATASET_NAMES) from None
