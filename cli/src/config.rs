//! `pico config set|get|ls|rm|use|path` (README.md, "Use it"): edit the profiles file. Data (a
//! profile, the list, the path) goes to stdout, acknowledgements to stderr.

use std::io::Write;

use pico_client::{Client, ClientConfig};

use crate::args::{Cli, ConfigArgs, ConfigCommand, ConfigSetArgs};
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
            apply_set(&mut config, cli, set)?;
            profile::save(&path, &config).map_err(Failure::Fatal)?;
            let name = &set.name;
            if config.default_profile.as_ref() == Some(name) {
                eprintln!("saved profile {name} (default)");
            } else {
                // Saving never changes which profile plain commands use: say how
                // to use this one.
                eprintln!(
                    "saved profile {name}; use it with --profile {name}, or make it the \
                     default with pico config use {name}"
                );
            }
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

/// `config set`: merges the given global flags into the profile; it becomes the default only
/// with `--default`.
fn apply_set(config: &mut ConfigFile, cli: &Cli, set: &ConfigSetArgs) -> Result<(), Failure> {
    let (name, no_http2) = (set.name.as_str(), set.no_http2);
    if name.is_empty() || name.chars().any(char::is_control) {
        return Err(Failure::Usage(format!("invalid profile name {name:?}")));
    }
    if cli.http2 && no_http2 {
        return Err(Failure::Usage(
            "--http2 and --no-http2 contradict each other".into(),
        ));
    }
    let nothing = cli.endpoint.is_none()
        && cli.protocol.is_none()
        && !cli.http2
        && !no_http2
        && cli.token.is_none()
        && cli.ca_cert.is_none();
    if nothing && !(set.default && config.profiles.contains_key(name)) {
        return Err(Failure::Usage(
            "nothing to save; pass --endpoint, --protocol, --http2, --no-http2, --token or \
             --ca-cert"
                .into(),
        ));
    }
    if let Some(endpoint) = &cli.endpoint {
        // The same check every client command makes, so a saved endpoint is usable.
        Client::new(ClientConfig::new(endpoint.clone()))
            .map_err(|e| Failure::Usage(e.to_string()))?;
    }
    let ca_cert = match &cli.ca_cert {
        // Absolute, so the profile works from any directory; read now, so a typo is caught.
        Some(path) => {
            std::fs::metadata(path).map_err(|e| {
                Failure::Fatal(format!("cannot read --ca-cert {}: {e}", path.display()))
            })?;
            Some(std::path::absolute(path).map_err(|e| {
                Failure::Fatal(format!("cannot resolve --ca-cert {}: {e}", path.display()))
            })?)
        }
        None => None,
    };
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
    if let Some(token) = &cli.token {
        profile.token = Some(token.clone());
    }
    if ca_cert.is_some() {
        profile.ca_cert = ca_cert;
    }
    if set.default {
        config.default_profile = Some(name.to_owned());
    }
    Ok(())
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

/// `<endpoint> <protocol> <http2>`, `-` for what the profile does not set, then
/// `token=(saved)` and `ca_cert=<path>` when it has them (never the token itself).
fn describe(profile: &Profile) -> String {
    let mut text = format!(
        "{} {} {}",
        profile.endpoint.as_deref().unwrap_or("-"),
        profile.protocol.map_or("-", |p| p.name()),
        profile
            .http2
            .map_or_else(|| "-".to_owned(), |h| h.to_string())
    );
    if profile.token.is_some() {
        text.push_str(" token=(saved)");
    }
    if let Some(path) = &profile.ca_cert {
        text.push_str(&format!(" ca_cert={}", path.display()));
    }
    text
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
            token: None,
            ca_cert: None,
        };
        assert_eq!(describe(&profile), "http://h:1 ds false");
        let secret = Profile {
            token: Some("s3cret".into()),
            ca_cert: Some("/etc/ca.pem".into()),
            ..profile
        };
        assert_eq!(
            describe(&secret),
            "http://h:1 ds false token=(saved) ca_cert=/etc/ca.pem"
        );
    }
}
