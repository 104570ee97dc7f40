"""The ``torchkube`` command line: one click group; subcommands live beside the code they drive."""

import click

@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="torchkube")
def main() -> None:
    """torchkube: elastic, fault-tolerant PyTorch training on Kubernetes."""

@main.command()
def crd() -> None:
    """Print the TrainingJob CustomResourceDefinition (generated from the API models)."""
    from torchkube.api.crd import crd_yaml

    click.echo(crd_yaml(), nl=False)

if __name__ == "__main__":
    main()
