from dyna_resources.cli import main


def test_cli_generate_transcode_inspect(tmp_path, capsys):
    assert (
        main(
            [
                "generate",
                str(tmp_path / "fleet"),
                "--episodes",
                "2",
                "--width",
                "96",
                "--height",
                "64",
                "--faults",
                "truncated=1",
            ]
        )
        == 0
    )
    files = sorted((tmp_path / "fleet").glob("*/*.h5"))  # fleet/<UTC time>/<episode>.h5
    assert len(files) == 2
    capsys.readouterr()
    results = [main(["transcode", str(f), str(tmp_path / (f.stem + ".mcap")), "--gop-frames", "30"]) for f in files]
    err = capsys.readouterr().err
    assert sorted(results) == [0, 1]  # the truncated file fails with a clear error, the other converts
    assert "error:" in err and "cannot open as HDF5" in err
    good = next(tmp_path.glob("*.mcap"))
    assert main(["inspect", str(good)]) == 0
    out = capsys.readouterr().out
    assert '"schema_version"' in out and "/camera/wrist" in out and "zstd" in out
    # the step ladder of the same episode, its task read from the MCAP's metadata, drawn on request
    assert main(["ladder", str(good), "--png", str(tmp_path / "ladder.png")]) == 0
    out = capsys.readouterr().out
    assert " reach " in out and " grasp " in out and (tmp_path / "ladder.png").read_bytes()[:4] == b"\x89PNG"
    assert main(["ladder", str(good), "--task", "juggle"]) == 1
    assert "no procedure for task 'juggle'" in capsys.readouterr().err
