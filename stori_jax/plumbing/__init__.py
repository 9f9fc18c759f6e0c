"""What every command shares: user errors (`errors`), running a command (`cli`), config files
(`config_files`), the workdir's identity and lock (`run_identity`), strict atomic JSON
(`jsonio`), figures (`plotting`), compile counts and host time (`profiling`) and several
processes (`multihost`). Nothing here knows CLIP."""
