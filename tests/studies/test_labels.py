"""`foundation compare labels` end to end on a tiny data set: pretraining runs, fine-tuning cells at
a label budget from scratch and from each pretraining, the report, the figure, and resuming."""
from __future__ import annotations

import json

from studies import labels


def test_label_budget_study_from_nothing(tmp_path, capsys):
    from foundation_tasks.classification import demo
    from foundation_tasks.segmentation import demo as seg_demo

    data = tmp_path / "data"
    demo.write_dataset(data / "vision-demo", seed=0, size=32, train_per_class=4, val_per_class=2, num_classes=10)
    seg_demo.write(data / "ade-demo", seed=0, n_train=10, n_val=2, height=48, width=64)
    argv = ["--data", str(data), "--out", str(tmp_path / "out"), "--tasks", "classification,segmentation",
            "--norms", "magneto", "--seeds", "0", "--budgets", "2,all", "--steps", "2", "--pretrain-steps", "2",
            "--jobs", "2", "--finetune", "train.batch_size=8", "eval.batch_size=20", "--pretrain", "train.batch_size=8"]
    assert labels.main(argv) == 2  # 2 is no fraction of the masks
    assert "--budgets: '2' is neither a fraction in (0, 1] (segmentation)" in capsys.readouterr().err
    argv[argv.index("2,all")] = "1,all"  # one image per class; every mask
    assert labels.main(argv) == 2  # the 'scenes' pretraining needs the segmentation data's unlabelled pool
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ade-demo/unlabelled: no such folder" in err and "--unlabelled 4000" in err
    seg_demo.write_pool(data / "ade-demo", seed=0, n=6, height=48, width=64)
    assert labels.main(argv) == 0
    out = tmp_path / "out"
    results = json.loads((out / "results.json").read_text())
    cells = {(c["task"], c["budget"], c["init"]): c for c in results["cells"]}
    assert set(cells) == ({("classification", b, i) for b in ("1", "all") for i in ("scratch", "pixels", "tokens")}
                          | {("segmentation", b, i) for b in ("1", "all") for i in ("scratch", "pixels", "scenes")})
    assert all(c["mean"] is not None and 0 <= c["mean"] <= 100 for c in cells.values())
    report = (out / "report.md").read_text()
    assert "`configs/segmentation/tiny.yaml`; from a pretraining with `optim.layer_decay=0.65`" in report
    timing = results["timing"]
    assert timing["jobs"] == 2 and timing["wall_s"] > 0 and {"pretrain_s", "finetune_s"} <= set(timing)
    assert "min of wall time, 2 runs at a time" in report
    assert "| magneto | 1 |" in report and "| MIM, pixel target, 2 steps |" in report and "## segmentation: mIoU" in report
    assert results["pretrain_steps"] == {"pixels": 2, "tokens": 2, "scenes": 2}
    assert (out / "labels.png").stat().st_size > 10_000
    ft = (out / "runs" / "classification-magneto-1-pixels-s0" / "config.yaml").read_text()
    assert "train_per_class: 1" in ft and "subset_seed: 0" in ft and "pretrain/pixels-magneto" in ft
    seg = (out / "runs" / "segmentation-magneto-1-pixels-s0" / "config.yaml").read_text()
    assert "train_fraction: 1" in seg and "pretrain/pixels-magneto" in seg  # one vision pretraining for both
    scenes = (out / "runs" / "segmentation-magneto-1-scenes-s0" / "config.yaml").read_text()
    assert "pretrain/scenes-magneto" in scenes
    # a fine-tuning from MIM adds the recipe's pretrained_overrides (BEiT's layer decay); scratch keeps the config's
    assert "layer_decay: 0.65" in scenes and "layer_decay: 0.65" in seg
    scratch = (out / "runs" / "segmentation-magneto-1-scratch-s0" / "config.yaml").read_text()
    assert "layer_decay: null" in scratch and "init_from: null" in scratch
    pool = (out / "pretrain" / "scenes-magneto" / "config.yaml").read_text()
    assert "ade-demo/unlabelled" in pool and "scale:\n  - 0.35" in pool
    assert sorted(p.name for p in (out / "pretrain").iterdir()) == ["pixels-magneto", "scenes-magneto", "tokenizer",
                                                                    "tokens-magneto"]
    tok = (out / "pretrain" / "tokenizer" / "config.yaml").read_text()  # distils the pixel-MIM run
    assert "teacher: run" in tok and "pretrain/pixels-magneto/best/model.safetensors" in tok
    assert "target: tokens" in (out / "pretrain" / "tokens-magneto" / "config.yaml").read_text()
    capsys.readouterr()
    assert labels.main(argv) == 0  # again: every run is read, none retrained
    assert "training ..." not in capsys.readouterr().out


def test_a_teacher_of_its_own_length(tmp_path, capsys):
    """--teacher-steps: the tokenizer distils a pixel-MIM run of that length, not the pixels
    pretraining (which is then not trained unless an init asks for it). A run folder that holds
    another configuration is refused, not read as the run asked for."""
    from foundation_tasks.classification import demo

    data = tmp_path / "data"
    demo.write_dataset(data / "vision-demo", seed=0, size=32, train_per_class=2, val_per_class=1, num_classes=10)
    out = tmp_path / "out"
    argv = ["--data", str(data), "--out", str(out), "--tasks", "classification", "--inits", "tokens", "--norms",
            "magneto", "--seeds", "0", "--budgets", "1", "--steps", "1", "--pretrain-steps", "2", "--teacher-steps",
            "3", "--finetune", "train.batch_size=8", "eval.batch_size=20", "--pretrain", "train.batch_size=8"]
    assert labels.main(argv) == 0
    pre = out / "pretrain"
    assert sorted(p.name for p in pre.iterdir()) == ["teacher-3", "tokenizer-teacher-3", "tokens-magneto"]
    assert "steps: 3\n" in (pre / "teacher-3" / "config.yaml").read_text()
    assert "pretrain/teacher-3/best/model.safetensors" in (pre / "tokenizer-teacher-3" / "config.yaml").read_text()
    tokens = (pre / "tokens-magneto" / "config.yaml").read_text()
    assert "steps: 2\n" in tokens and "tokenizer-teacher-3/best/model.safetensors" in tokens
    # a study moved elsewhere is still itself: its starts are compared from the study's folder on
    out.rename(tmp_path / "moved")
    out = tmp_path / "moved"
    pre = out / "pretrain"
    argv[argv.index("--out") + 1] = str(out)
    capsys.readouterr()
    assert labels.main(argv) == 0
    assert "training ..." not in capsys.readouterr().out
    # the same folder asked for pretrainings of another length (the tokenizer's is min(3000, N) too):
    # the runs there are not read as these
    argv[argv.index("--pretrain-steps") + 1] = "4"
    assert labels.main(argv) == 1
    captured = capsys.readouterr()
    assert "training ..." not in captured.out
    assert captured.err == (f"failed: {pre / 'tokenizer-teacher-3'} holds a run of another configuration (train.steps "
                            "differ); give --out another directory, or delete that run\n")
    assert "steps: 2\n" in (pre / "tokens-magneto" / "config.yaml").read_text()
    assert labels.main(["--teacher-steps", "0"]) == 2
    assert capsys.readouterr().err.strip().endswith("--teacher-steps: must be a positive number of steps (got 0)")


def test_bad_arguments_are_one_line(capsys):
    assert labels.main(["--budgets", "ten"]) == 2
    assert "--budgets: 'ten'" in capsys.readouterr().err
    assert labels.main(["--inits", "scratch,clip"]) == 2
    assert "unknown clip" in capsys.readouterr().err
    assert labels.main(["--tasks", "nlvr2"]) == 2
    assert "--tasks: nlvr2 fine-tunes from the vqa cells; add vqa" in capsys.readouterr().err
    assert labels.main(["--jobs", "0"]) == 2
    assert "--jobs: must be at least 1 (got 0)" in capsys.readouterr().err
    assert labels.main(["--tasks", "radar"]) == 2
    assert "--tasks: unknown radar" in capsys.readouterr().err
    assert labels.main(["--tasks", "asr", "--data", "nowhere"]) == 2
    assert "nowhere/speech-demo: no such folder (foundation data make speech" in capsys.readouterr().err


def test_vqa_from_the_pairs_pretraining_and_nlvr2_after_it(tmp_path, capsys):
    """VQA's pretraining is the pairs recipe (the class token naming the masked word), read from the vl
    data set's captions and images; each VQA cell starts from its norm's run, and NLVR2 (every
    statement) from each VQA cell."""
    from foundation_tasks.vl_common.demo import write_dataset

    data = tmp_path / "data"
    write_dataset(data / "vl", seed=0, vqa_train=12, vqa_val=6, questions_per_image=3, nlvr2_train=2, nlvr2_dev=2,
                  text_lines=20)
    out = tmp_path / "out"
    assert labels.main(["--data", str(data), "--out", str(out), "--tasks", "vqa,nlvr2", "--norms", "magneto", "--seeds",
                        "0", "--budgets", "0.5", "--steps", "2", "--pretrain-steps", "2", "--finetune",
                        "train.batch_size=4", "--pretrain", "train.batch_size=4"]) == 0
    pre = (out / "pretrain" / "vl-magneto" / "config.yaml").read_text()
    assert "kind: pair" in pre and "class_token_word: true" in pre and "conv_stem: true" in pre
    assert f"{data / 'vl'}/coco/annotations/captions_train2014.json" in pre and "steps: 2\n" in pre
    cell = (out / "runs" / "vqa-magneto-0.5-vl-s0" / "config.yaml").read_text()
    assert "pretrain/vl-magneto/best/model.safetensors" in cell and "train_fraction: 0.5" in cell
    for init in ("scratch", "vl"):  # NLVR2 from the VQA cell of the same norm, budget, init and seed
        nlvr2 = (out / "runs" / f"nlvr2-magneto-0.5-{init}-s0" / "config.yaml").read_text()
        assert f"runs/vqa-magneto-0.5-{init}-s0/best/model.safetensors" in nlvr2 and "nlvr2/nlvr2" not in nlvr2
        assert f"{data / 'vl'}/nlvr2" in nlvr2
    cells = {(c["task"], c["init"]): c for c in json.loads((out / "results.json").read_text())["cells"]}
    assert set(cells) == {(t, i) for t in ("vqa", "nlvr2") for i in ("scratch", "vl")}
    assert all(0 <= c["mean"] <= 100 for c in cells.values())
    report = (out / "report.md").read_text()
    assert "BEiT-3 pairs, class token names the word" in report and "## nlvr2: accuracy" in report
    assert "| fraction of the questions (its vqa start; all its own) |" in report


def test_a_thread_waiting_for_a_run_holds_no_slot_and_pretrainings_go_first(tmp_path, monkeypatch):
    """Two token pretrainings both need the teacher: while one trains it, the other waits without a
    slot, so the second core trains a scratch cell; a pretraining chain between its runs goes before
    any fine-tuning queued, and so does one that has not yet asked (a chain is expected from the start)."""
    import argparse
    import threading

    from studies import runs

    started: list[str] = []
    release = {name: threading.Event() for name in ("teacher", "cell-a", "cell-b", "cell-c", "tokens", "pixels")}

    def fake_ensure(config, overrides, run_dir, say, head):
        if runs.status(run_dir) == "finished":  # as runs.ensure: skipped
            return None
        started.append(run_dir.name)
        assert release[run_dir.name].wait(10)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "status.json").write_text(json.dumps({"status": "finished"}))

    monkeypatch.setattr(runs, "ensure", fake_ensure)
    out = tmp_path / "out"
    study = labels.Study(argparse.Namespace(out=str(out), data=str(tmp_path), jobs=2), {})
    pre, cells = out / "pretrain", out / "runs"

    def pause():
        threading.Event().wait(0.1)

    def wait_for(n):
        for _ in range(1000):
            if len(started) >= n:
                return
            threading.Event().wait(0.01)
        raise AssertionError(f"only {started} started")

    def go(*run_dirs, chain=False):
        def work():
            try:
                for run_dir in run_dirs:
                    study.train("c.yaml", run_dir, [])
            finally:
                if chain:
                    study.slots.chain_done()
        t = threading.Thread(target=work)
        t.start()
        return t

    study.slots.expect(2)  # two chains: teacher -> tokens (this norm), teacher -> ... (the other)
    threads = [go(cells / "cell-a")]  # asks first, but both chains are expected
    pause()
    threads.append(go(pre / "teacher", pre / "tokens", chain=True))
    wait_for(1)
    pause()
    assert started == ["teacher"]  # the other chain has not asked yet: cell-a waits
    threads.append(go(pre / "teacher", pre / "pixels", chain=True))  # waits for the teacher, holding no slot
    wait_for(2)
    assert started == ["teacher", "cell-a"]  # so the second core trains a cell meanwhile
    threads.append(go(cells / "cell-b"))
    pause()
    release["teacher"].set()  # both chains go on: the tokens and pixels runs before cell-b
    wait_for(3)
    pause()
    assert sorted(started[2:]) == ["tokens"] or sorted(started[2:]) == ["pixels"]
    release["cell-a"].set()
    wait_for(4)
    assert sorted(started[2:]) == ["pixels", "tokens"]
    for name in ("tokens", "pixels", "cell-b"):
        release[name].set()
    for t in threads:
        t.join(10)
    assert started[4:] == ["cell-b"] and started.count("teacher") == 1
    assert not study.failed


def test_quick_takes_the_pretraining_that_pays(tmp_path, capsys):
    """--quick fine-tunes from each task's first pretraining: for segmentation the scenes' MIM (which
    reads the unlabelled pool, so without one it stops there), not MIM on the vision demo's shapes."""
    from foundation_tasks.segmentation import demo as seg_demo

    data = tmp_path / "data"
    seg_demo.write(data / "ade-demo", seed=0, n_train=4, n_val=2, height=48, width=64)
    assert labels.main(["--quick", "--tasks", "segmentation", "--data", str(data), "--out", str(tmp_path / "o")]) == 2
    assert "ade-demo/unlabelled: no such folder; the 'scenes' pretraining" in capsys.readouterr().err


def test_training_time_is_counted_per_kind_of_run(tmp_path):
    """The report's time: each run's first to last metrics record, pretrainings apart from cells."""
    def run(path, times):
        path.mkdir(parents=True)
        (path / "metrics.jsonl").write_text("".join(json.dumps({"step": i, "time": t}) + "\n"
                                                    for i, t in enumerate(times)))
        return path

    runs = [run(tmp_path / "pretrain" / "pixels-magneto", [100.0, 130.0, 160.0]),
            run(tmp_path / "runs" / "classification-magneto-10-scratch-s0", [10.0, 40.0]),
            run(tmp_path / "runs" / "classification-magneto-10-pixels-s0", [5.0])]  # one record: no span
    assert labels.training_seconds(runs) == (60.0, 30.0)


def test_each_pretraining_runs_as_long_as_paid_unless_told(tmp_path, monkeypatch):
    """Without --pretrain-steps the scenes' MIM runs 18,000 steps and the token MIM 12,000 (distilling
    the pixels run, the config's 6,000 steps); --pretrain-steps sets every one."""
    import argparse

    from studies import runs

    def lengths(pretrain_steps):
        got: dict[str, list[str]] = {}

        def fake_ensure(config, overrides, run_dir, say, head):
            got[run_dir.name] = [o for o in overrides if o.startswith(("train.steps=", "tasks.0.teacher_run="))]
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "status.json").write_text(json.dumps({"status": "finished"}))

        monkeypatch.setattr(runs, "ensure", fake_ensure)
        out = tmp_path / f"out-{pretrain_steps}"
        study = labels.Study(argparse.Namespace(out=str(out), data=str(tmp_path), jobs=1, pretrain_steps=pretrain_steps,
                                                teacher_steps=None, pretrain=[]), {"vision": "v", "segmentation": "s"})
        for init in ("scenes", "tokens"):
            assert study.pretrain("preln", init) == out / "pretrain" / f"{init}-preln" / "best" / "model.safetensors"
        return got

    teacher = "pretrain/pixels-magneto/best/model.safetensors"
    got = lengths(None)
    assert got["scenes-preln"] == ["train.steps=18000"] and got["tokens-preln"] == ["train.steps=12000"]
    assert got["pixels-magneto"] == ["train.steps=6000"] and got["tokenizer"][0] == "train.steps=3000"
    assert got["tokenizer"][1].endswith(teacher)
    got = lengths(500)
    assert got["scenes-preln"] == got["tokens-preln"] == got["pixels-magneto"] == ["train.steps=500"]
    assert got["tokenizer"][0] == "train.steps=500" and got["tokenizer"][1].endswith(teacher)
