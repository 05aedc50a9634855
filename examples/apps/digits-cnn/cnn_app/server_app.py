"""ServerApp: FedAvg from the pretrained .pth (the resource's initModel)."""

from __future__ import annotations

from pathlib import Path

from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp

from workloads.sdk import FedAvg, run_strategy

from .task import DigitsCNN, evaluate, load_data, number

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Fine-tune for num-server-rounds. The platform loads initModel (the .pth) in place of
    the random initial arrays given here, which only say the model's names and shapes."""
    config = context.run_config
    model = DigitsCNN()
    test_dir = str(config["test-dir"])

    def held_out(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        if not test_dir:
            return None
        model.load_state_dict(arrays.to_torch_state_dict())
        loss, accuracy = evaluate(model, *load_data(Path(test_dir)))
        return MetricRecord({"test-loss": loss, "test-accuracy": accuracy})

    fraction_evaluate = number(config["fraction-evaluate"])
    folded = bool(config["evaluate-in-train"]) and fraction_evaluate > 0
    run_strategy(
        FedAvg(fraction_evaluate=0.0 if folded else fraction_evaluate),
        grid,
        initial_arrays=ArrayRecord(model.state_dict()),
        num_rounds=int(number(config["num-server-rounds"])),
        evaluate_fn=held_out,
        evaluate_in_train=folded,
    )
