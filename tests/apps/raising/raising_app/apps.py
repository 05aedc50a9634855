"""ServerApp (FedAvg through the SDK) and a ClientApp that raises on every message."""

import numpy as np
from flwr.app import ArrayRecord, Context, Message
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from workloads.sdk import data_dir, run_strategy

client = ClientApp()
server = ServerApp()


@client.train()
def train(msg: Message, context: Context) -> Message:
    raise ValueError(f"cannot parse {data_dir(context)}/labels.csv: no column 'label'")


@server.main()
def main(grid: Grid, context: Context) -> None:
    start = ArrayRecord([np.zeros(3, dtype=np.float32)])
    run_strategy(FedAvg(), grid, initial_arrays=start, num_rounds=2)
