"""``torchkube``: the click group and its subcommands (see the package's docstring)."""

import click

from torchkube.cli import cluster
from torchkube.local.cli import run_command
from torchkube.local.plot import plot_command
from torchkube.operator.main import operator_command
from torchkube.trainer.cli import export, prepare_data


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="torchkube")
def main() -> None:
    """torchkube: elastic, fault-tolerant PyTorch training on Kubernetes."""


main.add_command(operator_command)
main.add_command(run_command)
main.add_command(plot_command)
main.add_command(prepare_data, name="prepare-data")
main.add_command(export)

# Jobs on a cluster (current kubeconfig context): torchkube/cli/cluster.py.
main.add_command(cluster.submit)
main.add_command(cluster.status)
main.add_command(cluster.describe)
main.add_command(cluster.logs)
main.add_command(cluster.delete)
main.add_command(cluster.suspend)
main.add_command(cluster.resume)
main.add_command(cluster.scale)


@main.command()
def crd() -> None:
    """Print the TrainingJob CustomResourceDefinition (generated from the API models)."""
    from torchkube.api.crd import crd_yaml

    click.echo(crd_yaml(), nl=False)


if __name__ == "__main__":
    main()
