r"""Interactive preference-retrieval explorer (the paper's Figure 1) on a local web page.

  python -m stori_jax.explore --source tiny-synthetic                # embedded world
  python -m stori_jax.explore --source /ckpt/ViT-B-32 --images DIR   # any image folder

Opens http://127.0.0.1:8000: type a prompt (weights in the `(words:1.5)` syntax are allowed),
every word gets a weight slider, and the top images re-rank as a slider moves. The page
states what the index holds. The default index is the synthetic world: every colour x
pattern x shape (8 x 4 x 8) with --images_per_combination images each (2: 512 images, built
in seconds and cached). There the images' attributes are known, and beside the top k the
page plots App. B's per-category curves over the whole ranking: the prompt's colour, pattern
and shape words define 2**A categories (for "a red checkered heart": has red? has checkered?
has heart?), and curve c at n is category c's share of the top n images, n = 1..N. An image
folder has no labels: the page shows the top k only and says why. Start and stop block of
the reweighting (1-indexed, inclusive) are chosen in the page; they default to the model's
default start block and the text tower's last block. The server listens on loopback only,
serves at most 16 connections at once, and drops a client that has not sent a request's
headers within 10 s (its body: 30 s); see `stori_jax.explorer.limits`.

Images of `--images` that cannot be read are skipped, each named in a warning; the index
cache is keyed by every file's size and times, so replacing an image rebuilds it, and a
corrupt cache file is rebuilt with a warning. Requests are not logged unless --verbosity is
given. The library is `stori_jax.explorer` (its `app` module documents the JSON API); it
needs flask, the `explore` extra: without it the command says how to install it and exits 2.
"""

from __future__ import annotations

from absl import flags

from stori_jax.plumbing import cli
from stori_jax.plumbing.errors import UserError
from stori_jax.explorer import server


def define_flags(values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines the command's flags (when run as a program, or on a test's own FlagValues)."""
  fv = {"flag_values": values}
  flags.DEFINE_string("source", "tiny-synthetic", "Model (anything stori_jax.load accepts).", **fv)
  flags.DEFINE_string(
    "images", None, "Folder of images to index; default: the synthetic world.", **fv
  )
  flags.DEFINE_string("host", "127.0.0.1", "Loopback address to listen on.", **fv)
  flags.DEFINE_integer("port", 8000, "Port in [0, 65535] (0: any free port).", **fv)
  flags.DEFINE_string("cache_dir", "workdirs/retrieval_cache", "Index cache ('' disables).", **fv)
  flags.DEFINE_integer(
    "images_per_combination",
    2,
    "Synthetic world: images of each colour x pattern x shape (2: 512 images).",
    **fv,
  )
  flags.DEFINE_integer(
    "start_block",
    None,
    "First reweighted text block (1-indexed) the page opens with; default: the model's.",
    **fv,
  )
  flags.DEFINE_integer(
    "stop_block",
    None,
    "Last reweighted text block (inclusive) the page opens with; default: last.",
    **fv,
  )


def _announce(url: str, explorer) -> None:
  print(f"SToRI explorer on {url} (index: {explorer.description})", flush=True)


def main(argv: list[str], values: flags.FlagValues = flags.FLAGS) -> None:
  if len(argv) > 1:
    raise UserError(f"unexpected arguments {argv[1:]}; the explorer takes only flags (see --help)")
  server.serve(
    host=values.host,
    port=values.port,
    source=values.source,
    images=values.images,
    cache_dir=values.cache_dir or None,
    images_per_combination=values.images_per_combination,
    start_block=values.start_block,
    stop_block=values.stop_block,
    # absl defines --verbosity on the global flags; a test's own FlagValues may lack it
    log_requests="verbosity" in values and values["verbosity"].present,
    on_ready=_announce,
  )


if __name__ == "__main__":
  define_flags()
  cli.run(main)
