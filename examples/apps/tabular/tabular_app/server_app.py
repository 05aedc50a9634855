"""ServerApp: FedAvg of the logistic regression through the platform's strategy loop."""

from __future__ import annotations

from flwr.app import ArrayRecord, Context
from flwr.serverapp import Grid, ServerApp

from workloads.sdk import FedAvg, run_strategy

from .task import build_model, number

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run num-server-rounds of FedAvg; the platform stores checkpoints and the model."""
    model = build_model(int(number(context.run_config["features"])))
    folded = bool(context.run_config["evaluate-in-train"])
    run_strategy(
        FedAvg(fraction_evaluate=0.0 if folded else 1.0),
        grid,
        initial_arrays=ArrayRecord(model.state_dict()),
        num_rounds=int(number(context.run_config["num-server-rounds"])),
        evaluate_in_train=folded,
    )
