"""What every command shares: user errors (`errors`), running a command (`cli`), config files
(`config_files`), the workdir's identity and lock (`run_identity`), paths and URLs with the one
atomic writer (`paths`), strict atomic JSON (`jsonio`), the record of finished work a resumed
run reads (`finished`) and the file names of a workdir's units (`workdir_layout`), figures
(`plotting`), compile counts and host time (`profiling`) and several
processes (`multihost`). Nothing here knows CLIP."""
