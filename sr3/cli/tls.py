"""``sr3 tls``: the cluster's own CA, and certificates for its peers and clients."""

from __future__ import annotations

from pathlib import Path

import click

from sr3.cli._shared import fail_cleanly


@click.group()
def tls() -> None:
    """The cluster's CA and its certificates (HTTPS on every hop; see docs/operations.md).

    \b
    sr3 tls init --dir ca/                      the CA: ca.pem (give it out), ca.key (keep it)
    sr3 tls issue --ca ca/ --name peer-1 --san peer1 --san 10.0.0.1 --out certs/
    """


@tls.command("init")
@click.option("--dir", "directory", required=True, type=click.Path(file_okay=False, path_type=Path))
@click.option("--days", default=3650, show_default=True, type=click.IntRange(1, 36500))
@fail_cleanly
def init(directory: Path, days: int) -> None:
    """Make a new CA in DIR (ca.pem and ca.key; refuses to replace one)."""
    from sr3.certs import init_ca

    files = init_ca(directory, days=days)
    click.echo(f"CA certificate {files.cert} (give it to peers and clients)")
    click.echo(f"CA key {files.key} (mode 0600: keep it off the peers)")


@tls.command("issue")
@click.option("--ca", "ca_dir", required=True, type=click.Path(file_okay=False, path_type=Path))
@click.option("--name", required=True, help="The certificate's name (a peer id, a client).")
@click.option(
    "--san", "sans", multiple=True, required=True,
    help="A host name or IP it is reached at (repeat for each advertised one).",
)  # fmt: skip
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path))
@click.option("--days", default=365, show_default=True, type=click.IntRange(1, 3650))
@fail_cleanly
def issue(ca_dir: Path, name: str, sans: tuple[str, ...], out_dir: Path, days: int) -> None:
    """Issue (or renew: same name, same --out) a certificate signed by the CA."""
    from sr3.certs import issue as issue_cert

    issued = issue_cert(ca_dir, out_dir, name, list(sans), days=days)
    click.echo(f"{issued.cert} and {issued.key}, valid until {issued.not_after:%Y-%m-%d %H:%M} UTC")
