//! `pico config set|get|ls|rm|use|path` (README.md, "Use it"): edit the profiles file. Data (a
//! profile, the list, the path) goes to stdout, acknowledgements to stderr.

use std::io::Write;

use pico_client::{Client, ClientConfig};

use crate::args::{Cli, ConfigArgs, ConfigCommand};
use crate::profile::{self, ConfigFile, Profile};
use crate::Failure;

pub fn run(cli: &Cli, args: &ConfigArgs) -> Result<(), Failure> {
    let path = profile::config_path().ok_or_else(|| {
        Failure::Fatal(
            "cannot locate the config file: set PICO_CONFIG or HOME (or XDG_CONFIG_HOME)".into(),
        )
    })?;
    let mut out = std::io::stdout().lock();
    match &args.command {
        ConfigCommand::Path(_) => {
            writeln!(out, "{}", path.display())?;
        }
        ConfigCommand::Set(set) => {
            let mut config = profile::load(&path).map_err(Failure::Fatal)?;
            let became_default = apply_set(&mut config, cli, &set.name, set.no_http2)?;
            profile::save(&path, &config).map_err(Failure::Fatal)?;
            let note = if became_default { " (default)" } else { "" };
            eprintln!("saved profile {}{note}", set.name);
        }
        ConfigCommand::Get(get) => {
            let config = profile::load(&path).map_err(Failure::Fatal)?;
            let name = match &get.name {
                Some(name) => name.clone(),
                None => config.default_profile.clone().ok_or_else(|| {
                    Failure::Fatal(
                        "no default profile; name one, or set one with pico config use <name>"
                            .into(),
                    )
                })?,
            };
            let profile = existing(&config, &name, &path)?;
            writeln!(out, "{name}\t{}", describe(profile))?;
        }
        ConfigCommand::Ls(_) => {
            let config = profile::load(&path).map_err(Failure::Fatal)?;
            if config.profiles.is_empty() {
                eprintln!(
                    "no profiles in {}; save one with pico --endpoint <url> config set <name>",
                    path.display()
                );
            }
            for name in config.profiles.keys() {
                if config.default_profile.as_ref() == Some(name) {
                    writeln!(out, "{name} (default)")?;
                } else {
                    writeln!(out, "{name}")?;
                }
            }
        }
        ConfigCommand::Rm(rm) => {
            let mut config = profile::load(&path).map_err(Failure::Fatal)?;
            existing(&config, &rm.name, &path)?;
            config.profiles.remove(&rm.name);
            if config.default_profile.as_ref() == Some(&rm.name) {
                config.default_profile = None;
            }
            profile::save(&path, &config).map_err(Failure::Fatal)?;
            eprintln!("removed profile {}", rm.name);
        }
        ConfigCommand::Use(set) => {
            let mut config = profile::load(&path).map_err(Failure::Fatal)?;
            existing(&config, &set.name, &path)?;
            config.default_profile = Some(set.name.clone());
            profile::save(&path, &config).map_err(Failure::Fatal)?;
            eprintln!("default profile {}", set.name);
        }
    }
    out.flush()?;
    Ok(())
}

/// `config set`: merges the given global flags into the profile. Returns whether the
/// profile became the default (the first one saved).
fn apply_set(
    config: &mut ConfigFile,
    cli: &Cli,
    name: &str,
    no_http2: bool,
) -> Result<bool, Failure> {
    if name.is_empty() || name.chars().any(char::is_control) {
        return Err(Failure::Usage(format!("invalid profile name {name:?}")));
    }
    if cli.http2 && no_http2 {
        return Err(Failure::Usage(
            "--http2 and --no-http2 contradict each other".into(),
        ));
    }
    if cli.endpoint.is_none() && cli.protocol.is_none() && !cli.http2 && !no_http2 {
        return Err(Failure::Usage(
            "nothing to save; pass --endpoint, --protocol, --http2 or --no-http2".into(),
        ));
    }
    if let Some(endpoint) = &cli.endpoint {
        // The same check every client command makes, so a saved endpoint is usable.
        Client::new(ClientConfig::new(endpoint.clone()))
            .map_err(|e| Failure::Usage(e.to_string()))?;
    }
    let profile = config.profiles.entry(name.to_owned()).or_default();
    if let Some(endpoint) = &cli.endpoint {
        profile.endpoint = Some(endpoint.clone());
    }
    if let Some(protocol) = cli.protocol {
        profile.protocol = Some(protocol);
    }
    if cli.http2 {
        profile.http2 = Some(true);
    } else if no_http2 {
        profile.http2 = Some(false);
    }
    let became_default = config.default_profile.is_none();
    if became_default {
        config.default_profile = Some(name.to_owned());
    }
    Ok(became_default)
}

fn existing<'c>(
    config: &'c ConfigFile,
    name: &str,
    path: &std::path::Path,
) -> Result<&'c Profile, Failure> {
    config
        .profiles
        .get(name)
        .ok_or_else(|| Failure::Fatal(format!("profile {name:?} not found in {}", path.display())))
}

/// `<endpoint> <protocol> <http2>`, `-` for what the profile does not set.
fn describe(profile: &Profile) -> String {
    format!(
        "{} {} {}",
        profile.endpoint.as_deref().unwrap_or("-"),
        profile.protocol.map_or("-", |p| p.name()),
        profile
            .http2
            .map_or_else(|| "-".to_owned(), |h| h.to_string())
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_are_described_with_dashes_for_unset_values() {
        assert_eq!(describe(&Profile::default()), "- - -");
        let profile = Profile {
            endpoint: Some("http://h:1".into()),
            protocol: Some(pico_client::Protocol::DurableStreams),
            http2: Some(false),
        };
        assert_eq!(describe(&profile), "http://h:1 ds false");
    }
}
