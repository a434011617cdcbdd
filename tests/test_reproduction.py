"""The account of the reproduction (``reports.reproduction``): README.md's and results/REPRODUCTION.md's generated
blocks are what ``python -m reports --reproduction`` writes from ``results/reference/``, README's list of gaps says
what its table shows, and no measured figure stands in two documents."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from recbench.reports import reproduction
from recbench.reports.__main__ import main as cli
from recbench.reports.published import load_published
from recbench.reports.results import load_results
from recbench.reports.tables import model_groups, ratio_table
from recbench.reports.time_to_quality import load_anchors
from tests.fixtures.reports_fixture import counts_for, ranking_row, write_results
from tests.helpers import ROOT

README = ROOT / "README.md"
GAP_BAND = reproduction.GAP_BAND  # README lists every row whose NDCG@10 is further than this from the paper's
# The documents a reader is sent to; published values (reports/published.csv) may stand in several of them.
DOCUMENTS = ("README.md", "results/REPRODUCTION.md", "models/fidelity.md", "PAPER.md", "PROTOCOL.md",
             "ARCHITECTURE.md", "benchmarks/GUIDE.md", "benchmarks/EXTENDING.md", "results/README.md")
# A measured value as the documents write it, .4612 or 0.4612; not a standard deviation (± .0030), not a signed
# difference (+0.0234, derived from two figures) and not one below .01, which two unrelated measurements share by
# chance.
FIGURE = re.compile(r"(?<![\d.])(?<!± )(?<!± 0)(?<![+−-])(?<![+−-]0)0?(\.(?!00)\d{4})(?!\d)")


@pytest.mark.parametrize("document", reproduction.DOCUMENTS, ids=lambda path: path.name)
def test_every_generated_block_is_what_its_files_give(document):
    found = reproduction.expected(document)
    assert found, f"{document} has no generated block"
    differing = [name for name, (text, built) in found.items() if text != built]
    assert not differing, (f"{document.relative_to(ROOT)}: blocks {differing} differ from their files; run "
                           f"python -m reports --reproduction")
    for name, (text, _) in found.items():
        for figure in re.findall(r"\]\((figures/[^)]+)\)", text):
            assert (document.parent / figure).is_file(), f"{name} shows {figure}, which is not there"


def test_the_blocks_the_readme_promises_are_there():
    found = reproduction.expected(README)
    assert {"paper-comparison", "cost"} <= set(found)
    table = found["paper-comparison"][1]
    assert table.count("\n| ") - 1 <= 25  # rows, less the header
    assert "converge-ml-1m.json" in table and "converge-beauty.json" in table  # it names the files it read


def test_a_block_edited_by_hand_is_named_and_rewritten_from_its_files(tmp_path):
    copy = tmp_path / "README.md"
    shutil.copy(README, copy)
    text = copy.read_text()
    start = text.index("<!-- generated: paper-comparison -->")
    edited = text[:start] + text[start:].replace("0.4759", "0.4760", 1)  # the paper's BERT4Rec, retyped wrongly
    copy.write_text(edited)
    assert reproduction.stale(copy) == ["paper-comparison"]
    assert reproduction.rewrite(copy) == ["paper-comparison"]
    assert copy.read_text() == text and reproduction.stale(copy) == []


def test_the_check_mode_writes_nothing_and_says_whether_the_blocks_stand(capsys):
    before = {path: path.read_text() for path in reproduction.DOCUMENTS}
    assert cli(["--reproduction", "--check"]) == 0
    assert "every generated block is as its files give it" in capsys.readouterr().out
    assert {path: path.read_text() for path in reproduction.DOCUMENTS} == before
    with pytest.raises(SystemExit):
        cli(["--check"])  # only with --reproduction


def test_the_ratio_table_by_hand(tmp_path):
    """Ours over the paper: the mean over seeds divided by the published row each is held against; a model the
    paper lacks gets gaps, and the table is the same in a user's report."""
    rows = [ranking_row(tmp_path, "ml-1m", model, seed) for model in ("sasrec", "sasrec-ce") for seed in (0, 1)]
    for row in rows:
        row["metrics"]["NDCG@10"] = {0: 0.40, 1: 0.42}[row["seed"]]
        row["profile"] = "converge"
    results = load_results(write_results(tmp_path, rows))
    table = ratio_table(model_groups(results), load_published()[0])
    cells = {row[1].text: row for row in table.rows}
    published = next(e.value for e in load_published()[0] if (e.table, e.dataset, e.model, e.metric)
                     == ("Table 2", "ml-1m", "sasrec", "NDCG@10"))
    assert cells["SASRec"][4].value == published and cells["SASRec"][5].text == f"{0.41 / published:.2f}"
    assert cells["SASRec-CE"][4].text == "–" and cells["SASRec-CE"][5].text == "–"
    # Table 2's SASRec row is Table 3's, at d = 256: the table says it holds a d = 64 row against another size
    assert any(note.startswith("SASRec: Table 2's row equals Table 3's, at d = 256, and ours runs at d = 64")
               for note in table.notes)
    assert not any("SASRec-CE" in note for note in table.notes if "best setting" in note or "d = 256" in note)
    from recbench.reports import generate_report

    assert "Ours against the paper" in generate_report(tmp_path).read_text()


def readme_table() -> dict[tuple[str, str], float]:
    """README's comparison: (dataset, model) -> our NDCG@10 mean over the paper's."""
    text = reproduction.expected(README)["paper-comparison"][0]
    ratios = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) > 5 and re.match(r"\d", cells[4]):
            ratios[(cells[0], cells[1])] = float(cells[3].split(" ± ")[0]) / float(cells[4])
    return ratios


def test_readmes_list_of_gaps_says_what_its_table_shows():
    """One sentence per row further than 3% from the paper, saying which way; none for the rows within it."""
    ratios = readme_table()
    said = {(dataset, model): way for dataset, model, way in
            re.findall(r"^- \*\*(\S+) (.+?)\*\* (below|above) the paper", README.read_text(), re.M)}
    gaps = {key: "below" if ratio < 1 else "above" for key, ratio in ratios.items() if abs(ratio - 1) > GAP_BAND}
    assert said == gaps


# Two different measurements that happen to share four decimals, each typed in one document (the first named) and
# written by a block of another: figure -> what each is.
COINCIDENCES = {
    ".0124": "fidelity: Cloze 1-mask (last) full, seed 1 / SASRec's Beauty full NDCG@10",
    ".0136": "fidelity: Cloze 1-mask (last) full, seed 0 / a list metric of the splits' tables",
    ".0196": "fidelity: BERT4Rec at lr 1e-4 after 10 epochs / a list metric of the splits' tables",
    ".0210": "fidelity: BERT4Rec's earlier design after 600 steps / the splits' tables",
    ".0326": "fidelity: GRU4Rec's ML-100k validation at epoch 20 / FPMC's best Beauty validation (anchor candidates)",
    ".0328": "fidelity: BERT4Rec 1 mask (random item), full NDCG@10 / Caser's Beauty HR@1 in Table 2",
    ".0356": "fidelity: BPR-MF at d = 128, full NDCG@10 / LSTM's best Beauty validation (anchor candidates)",
    ".0373": "fidelity: BPR-MF at d = 32 / the splits' tables",
    ".0383": "fidelity: BERT4Rec's paper profile, seed 1, 600 steps / NCF's ML-1m full NDCG@10",
    ".0459": "fidelity: BERT4Rec paper profile, seed 0 full NDCG@10 / GRU4Rec's Beauty HR@5 in Table 2",
    ".0700": "fidelity: BERT4Rec's converge schedule after 10 epochs, full / SASRec's defaults on ML-100k, full",
    ".1049": "fidelity: a SASRec switch's HR@10 / the splits' tables",
    ".1273": "fidelity: NCF at 4 negatives, NDCG@10 / NCF's Beauty HR@5 in Table 2",
    ".1408": "fidelity: SASRec with float32 dropout masks, full HR@10 / Table 5's h = 1 under full ranking",
    ".1442": "fidelity: SASRec retrained on s[:-1], HR@10 after 10 epochs / BERT4Rec's ML-1m full NDCG@10",
    ".1537": "fidelity: Klenitskiy & Vasilev's published replication / README: SASRec's Beauty NDCG@10",
    ".3259": "fidelity: Caser with pad_windows, pop100 NDCG@10 / GRU4Rec's ML-1m NDCG@5 in Table 2",
    ".3752": "fidelity: NCF's 6-epoch paper-profile HR@10 / README: NCF's converged ML-1m HR@10",
}


def test_no_measured_figure_stands_in_two_documents():
    """A figure typed in a document (outside its generated blocks) stands nowhere else, typed or generated; the
    published values may (the paper's and the other implementations' of reports/anchors.csv), and so may the listed
    coincidences."""
    published = {f"{entry.value:.4f}"[1:] for entry in [*load_published()[0], *load_anchors()] if entry.value < 1}
    typed: dict[str, set[str]] = {}
    anywhere: dict[str, set[str]] = {}
    for name in DOCUMENTS:
        text = (ROOT / name).read_text(encoding="utf-8")
        for figure in FIGURE.findall(text):
            anywhere.setdefault(figure, set()).add(name)
        for figure in FIGURE.findall(reproduction.BLOCK.sub("", text)):
            typed.setdefault(figure, set()).add(name)
    twice = {figure: sorted(anywhere[figure]) for figure in typed
             if len(anywhere[figure]) > 1 and figure not in published and figure not in COINCIDENCES}
    assert not twice, f"figures typed in more than one document (keep one, link to it there): {twice}"
    assert all(len(anywhere.get(figure, ())) > 1 for figure in COINCIDENCES), "a listed coincidence is gone"


def test_the_reproduction_lives_in_tracked_files():
    tracked = subprocess.run(["git", "ls-files", "results/REPRODUCTION.md", "results/figures"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.split()
    assert "results/REPRODUCTION.md" in tracked and any(name.endswith(".png") for name in tracked)


def test_readmes_losses_sentence_names_each_change_with_its_label(tmp_path):
    """Each loss against the full softmax on its dataset, in percent of NDCG@10 under full ranking, with the label a
    paired test over users gives it; no reference file: one sentence that says so."""
    assert "no converged run kept yet" in reproduction.losses_summary(tmp_path)
    rows = [ranking_row(tmp_path, "beauty", model, seed, "full", study="losses", variant=variant,
                        counts=counts_for("beauty", "sasrec-ce", seed, "full", scale))
            for model, variant, scale in (("gsasrec", "gBCE (gSASRec)", 0.2), ("sasrec-ce", "full softmax", 1.0),
                                          ("sasrec-ss", "sampled softmax", 1.0))  # sasrec-ss ranks as sasrec-ce
            for seed in (0, 1)]
    copies = tmp_path / "per-user" / "rows-study-losses-converge"
    copies.mkdir(parents=True)
    for row in rows:
        shutil.move(tmp_path / row["per_user_file"], copies / Path(row["per_user_file"]).name)
    (tmp_path / reproduction.LOSSES).write_text(json.dumps({"rows": rows}))
    results = reproduction.reference_results(tmp_path / reproduction.LOSSES)
    mean = {m: np.mean([r.metrics["NDCG@10"] for r in results.rows if r.model == m]) for m in ("gsasrec", "sasrec-ce",
                                                                                            "sasrec-ss")}
    sentence = reproduction.losses_summary(tmp_path)
    assert f"gBCE (gSASRec) {100 * (mean['gsasrec'] / mean['sasrec-ce'] - 1):+.1f}% on Beauty (2 seeds, robust)" \
        in sentence
    assert "sampled softmax +0.0% on Beauty (2 seeds, not resolved)" in sentence  # the same ranks: no change
    # the document's block names the very figures the study's figure code draws
    from recbench.reports.losses import loss_figures

    block = reproduction.loss_tables(tmp_path)
    drawn = {figure.name for figure in loss_figures(results, tmp_path / "figures").figures}
    assert set(re.findall(r"\(figures/([\w-]+)\.png\)", block)) == drawn == {
        "losses_quality_vs_time_full", "losses_curves_beauty"}


def test_the_anchors_choose_among_every_configuration_trained_each_listed_once(tmp_path):
    # the study takes Table 2's SASRec-CE job under its own key (reused_from names the job): listing it again as
    # "losses study: full softmax" would show one run twice among the configurations validation chose from
    table2 = {dataset: [ranking_row(tmp_path, dataset, "sasrec-ce", 0, protocol, key=f"{dataset}-main-job")
                        for protocol in ("full", "pop100")] for dataset in ("beauty", "ml-1m")}
    for dataset, rows in table2.items():
        (tmp_path / f"converge-{dataset}.json").write_text(json.dumps({"rows": rows}))
    study = [ranking_row(tmp_path, "beauty", "sasrec-ce", 0, protocol, study="losses", variant="full softmax",
                         key="study-key", reused_from={"key": "beauty-main-job", "folder": "elsewhere"})
             for protocol in ("full", "pop100")]
    study += [ranking_row(tmp_path, "beauty", "gsasrec", 0, protocol, study="losses", variant="gBCE", key="gbce")
              for protocol in ("full", "pop100")]
    (tmp_path / reproduction.LOSSES).write_text(json.dumps({"rows": study}))
    # a probe that changed a setting is a configuration of its own; one that changed nothing is the profile's
    probes = [ranking_row(tmp_path, "ml-1m", "sasrec-ce", 0, protocol, hidden=hidden, key=f"probe-{hidden}")
              for protocol in ("full", "pop100") for hidden in (128, 64)]
    (tmp_path / "rows-probe-ml-1m-wider.json").write_text(json.dumps({"rows": probes}))
    candidates, read = reproduction._anchor_candidates(tmp_path)
    assert sorted(candidates["beauty"]) == ["SASRec-CE", "losses study: gBCE"]
    assert sorted(candidates["ml-1m"]) == ["SASRec-CE", "SASRec-CE, hidden 128"]
    assert tmp_path / "rows-probe-ml-1m-wider.json" in read


def test_a_gap_is_resolved_against_the_runs_own_spread_pooled_over_the_dataset(tmp_path):
    """Two rows of two seeds on ML-1m: their log spread pooled (2 degrees of freedom) is the noise of a run, the
    paper's figure one run of it; a far gap is resolved, a near one (outside the 3% band) is not, and a row inside
    the band is not listed. Beauty's row: one seed, so no spread: its gap is listed as not tested."""
    from scipy import stats

    published = {(e.dataset, e.model): e.value for e in load_published()[0]
                 if (e.table, e.metric, e.variant) == ("Table 2", "NDCG@10", None)}
    values = {("ml-1m", "bprmf"): [0.5 * published[("ml-1m", "bprmf")], 0.51 * published[("ml-1m", "bprmf")]],
              ("ml-1m", "caser"): [0.95 * published[("ml-1m", "caser")], 0.96 * published[("ml-1m", "caser")]],
              ("ml-1m", "fpmc"): [0.97 * published[("ml-1m", "fpmc")], 1.03 * published[("ml-1m", "fpmc")]],
              ("beauty", "fpmc"): [0.5 * published[("beauty", "fpmc")]]}
    for dataset in ("ml-1m", "beauty"):
        rows = []
        for (where, model), seeds in values.items():
            for seed, value in enumerate(seeds):
                if where == dataset:
                    row = ranking_row(tmp_path, dataset, model, seed, "pop100", with_per_user=False)
                    row["metrics"]["NDCG@10"] = value
                    rows.append(row)
        (tmp_path / f"converge-{dataset}.json").write_text(json.dumps({"rows": rows}))
    block = reproduction.gaps(tmp_path)
    squares = [(np.log(a) - np.log(b)) ** 2 / 2 for a, b in (values[("ml-1m", m)] for m in ("bprmf", "caser",
                                                                                             "fpmc"))]
    noise = np.sqrt(sum(squares) / 3 * 1.5)  # pooled variance (3 rows, 1 degree of freedom each), × (1/2 + 1)
    gaps = {m: np.log(np.sqrt(np.prod(values[("ml-1m", m)])) / published[("ml-1m", m)]) for m in ("bprmf", "caser")}
    p = {m: 2 * stats.t.sf(abs(gaps[m]) / noise, 3) for m in gaps}
    holm = {m: min(1.0, 2 * p[m]) if p[m] == min(p.values()) else max(min(1.0, 2 * min(p.values())), p[m])
            for m in p}
    listed = {re.match(r"- \*\*(.+?)\*\*", line).group(1): line for line in block.splitlines()
              if line.startswith("- ")}
    assert "(degrees of freedom: ML-1m 3)" in block
    assert set(listed) == {"Beauty FPMC", "ML-1m BPR-MF", "ML-1m Caser"}  # ML-1m's FPMC equals the paper's
    bprmf, caser = listed["ML-1m BPR-MF"], listed["ML-1m Caser"]
    assert f"below the paper (ours / paper {(0.5 + 0.51) / 2:.2f}): resolved, p = {holm['bprmf']:.2g}" in bprmf
    assert f"below the paper (ours / paper {(0.95 + 0.96) / 2:.2f}): not resolved, p = {holm['caser']:.2g}" in caser
    assert "not tested: no row of its dataset has two seeds" in listed["Beauty FPMC"]


def test_each_gap_links_the_section_of_the_reproduction_that_accounts_for_it():
    """The link goes to the heading naming the model, on the dataset where a heading names one; every anchor is a
    heading of the reproduction document."""
    from tests.test_docs import headings as anchors_of

    anchors = anchors_of(reproduction.DOCUMENTS[1].read_text(encoding="utf-8"))
    found = reproduction._gap_headings()
    assert reproduction._gap_section("beauty", "bert4rec", found) == "bert4rec-on-beauty"
    assert reproduction._gap_section("ml-1m", "bert4rec", found) == "bert4rec-on-ml-1m"
    assert reproduction._gap_section("ml-1m", "gru4rec+", found) == "gru4rec-and-gru4rec"
    assert reproduction._gap_section("beauty", "sasrec", found) == "sasrec"  # not SASRec-CE's section
    links = re.findall(r"\(results/REPRODUCTION\.md#([\w-]+)\)", README.read_text(encoding="utf-8"))
    assert links and set(links) <= anchors
