"""Runs on the hub: Flower's FedAvg through the platform's strategy loop."""

from pathlib import Path

from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from workloads.sdk import run_strategy

from .model import accuracy, load, make_model

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    model = make_model()
    test_dir = str(context.run_config["test-dir"])

    def score(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        if not test_dir:  # held-out data on the hub, if the run config names it
            return None
        model.load_state_dict(arrays.to_torch_state_dict())
        return MetricRecord({"test-accuracy": accuracy(model, *load(Path(test_dir)))})

    # Starts from initModel or the last checkpoint when the platform has one, checkpoints
    # every round and stores the final model.
    run_strategy(
        FedAvg(),
        grid,
        initial_arrays=ArrayRecord(model.state_dict()),
        num_rounds=int(context.run_config["num-server-rounds"]),
        evaluate_fn=score,
    )
