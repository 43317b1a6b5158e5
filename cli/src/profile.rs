//! Saved connection profiles (README.md, "Use it"): read by every command except `config`, written
//! by `pico config ...` (see `config.rs`) with mode 0600, as it may one day hold credentials.
//!
//! The file is TOML, read and written with the `toml` crate through serde:
//!
//! ```toml
//! default_profile = "prod"
//!
//! [profiles.prod]
//! endpoint = "http://node2.internal:4437"
//! protocol = "ds"        # "pico" or "ds"
//! http2 = true
//! token = "..."          # --token, sent as a bearer token
//! ca_cert = "/etc/pico/ca.pem"
//! ```
//!
//! Unknown keys are rejected, so a misspelt setting is an error rather than silently ignored.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use pico_client::Protocol;
use serde::{Deserialize, Serialize};

/// Defaults for the global connection flags.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "protocol_name"
    )]
    pub protocol: Option<Protocol>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http2: Option<bool>,
    /// Bearer token (`--token`); the file is private (0600), and `config get` never prints it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// CA certificate file (`--ca-cert`), saved as an absolute path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_cert: Option<PathBuf>,
}

#[derive(Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_profile: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub profiles: BTreeMap<String, Profile>,
}

/// `protocol = "pico"` or `"ds"`: the names `--protocol` takes.
mod protocol_name {
    use pico_client::Protocol;
    use serde::{de::Error, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(
        protocol: &Option<Protocol>,
        out: S,
    ) -> Result<S::Ok, S::Error> {
        match protocol {
            Some(protocol) => out.serialize_str(protocol.name()),
            None => out.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(input: D) -> Result<Option<Protocol>, D::Error> {
        let name = String::deserialize(input)?;
        name.parse().map(Some).map_err(D::Error::custom)
    }
}

/// `$PICO_CONFIG`, else the platform config directory + `pico/config.toml`.
pub fn config_path() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("PICO_CONFIG").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(path));
    }
    let home = std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from);
    let dir = if cfg!(target_os = "macos") {
        home?.join("Library/Application Support")
    } else {
        match std::env::var_os("XDG_CONFIG_HOME").filter(|d| !d.is_empty()) {
            Some(dir) => PathBuf::from(dir),
            None => home?.join(".config"),
        }
    };
    Some(dir.join("pico").join("config.toml"))
}

/// The profile a command runs with, and which one it is, to name it when the command fails.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resolved {
    pub profile: Profile,
    /// `None`: no profile (none named and no default in the file).
    pub name: Option<String>,
    /// Whether it was taken as the file's `default_profile` rather than named by `--profile`.
    pub by_default: bool,
}

/// The profile to use: the named one (an error if it does not exist), else the file's
/// default (silently none if missing). A missing file is an empty config.
pub fn resolve(name: Option<&str>) -> Result<Resolved, String> {
    let path = config_path();
    let config = match &path {
        Some(path) => load(path)?,
        None => ConfigFile::default(),
    };
    let where_ = path.map_or_else(|| "the config file".to_owned(), |p| p.display().to_string());
    let profile = select(&config, name, &where_)?;
    let (name, by_default) = match name {
        Some(name) => (Some(name.to_owned()), false),
        None => (
            config
                .default_profile
                .clone()
                .filter(|d| config.profiles.contains_key(d)),
            true,
        ),
    };
    Ok(Resolved {
        profile,
        name,
        by_default,
    })
}

/// Reads and parses the file; a missing file is an empty config.
pub fn load(path: &Path) -> Result<ConfigFile, String> {
    match std::fs::read_to_string(path) {
        Ok(text) => parse(&text).map_err(|e| format!("{}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(ConfigFile::default()),
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}

/// Writes the file atomically (a temporary file renamed over it), mode 0600 on Unix,
/// creating its directory if needed.
pub fn save(path: &Path, config: &ConfigFile) -> Result<(), String> {
    let fail = |what: &str, e: std::io::Error| format!("cannot {what} {}: {e}", path.display());
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| fail("create the directory of", e))?;
    }
    let mut temp_name = path.file_name().unwrap_or_default().to_os_string();
    temp_name.push(format!(".tmp-{}", std::process::id()));
    let temp = path.with_file_name(temp_name);
    let write = || -> std::io::Result<()> {
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut file = options.open(&temp)?;
        // `mode` only applies to a new file: make sure a leftover one is private too.
        #[cfg(unix)]
        file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
        file.write_all(render(config).as_bytes())?;
        file.sync_all()?;
        std::fs::rename(&temp, path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&temp);
        fail("write", e)
    })
}

/// The file's text: `default_profile`, then one table per profile, keys in a fixed order.
pub fn render(config: &ConfigFile) -> String {
    // Strings, booleans and tables only: nothing toml cannot represent.
    toml::to_string(config).expect("a profile file serializes")
}

fn select(config: &ConfigFile, name: Option<&str>, where_: &str) -> Result<Profile, String> {
    match name {
        Some(name) => config
            .profiles
            .get(name)
            .cloned()
            .ok_or_else(|| format!("profile {name:?} not found in {where_}")),
        None => Ok(config
            .default_profile
            .as_ref()
            .and_then(|d| config.profiles.get(d))
            .cloned()
            .unwrap_or_default()),
    }
}

/// Parses the file; errors name the line, on one line as the other errors of `pico` are.
pub fn parse(text: &str) -> Result<ConfigFile, String> {
    toml::from_str(text).map_err(|error| {
        let message = error.message().trim();
        // serde's wording for a key `deny_unknown_fields` refused:
        // "unknown field `k`, expected ...".
        let message = match message
            .strip_prefix("unknown field `")
            .and_then(|rest| rest.split_once('`'))
        {
            Some((key, _)) => format!("unknown or mistyped key {key:?}"),
            None => message.replace('\n', "; "),
        };
        match error.span() {
            Some(span) => {
                let line = text[..span.start.min(text.len())].matches('\n').count() + 1;
                format!("line {line}: {message}")
            }
            None => message,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r#"
default_profile = "prod"   # the default

[profiles.prod]
endpoint = "http://node2.internal:4437"
protocol = "ds"        # "pico" or "ds"
http2 = true

[profiles."local#1"]
endpoint = "http://127.0.0.1:4437"
"#;

    #[test]
    fn parses_the_documented_format() {
        let config = parse(SAMPLE).unwrap();
        assert_eq!(config.default_profile.as_deref(), Some("prod"));
        let prod = &config.profiles["prod"];
        assert_eq!(prod.endpoint.as_deref(), Some("http://node2.internal:4437"));
        assert_eq!(prod.protocol, Some(Protocol::DurableStreams));
        assert_eq!(prod.http2, Some(true));
        assert_eq!(config.profiles["local#1"].protocol, None);
    }

    #[test]
    fn selection_rules() {
        let config = parse(SAMPLE).unwrap();
        assert_eq!(select(&config, None, "f").unwrap().http2, Some(true));
        assert!(select(&config, Some("local#1"), "f").is_ok());
        let err = select(&config, Some("nope"), "f").unwrap_err();
        assert_eq!(err, "profile \"nope\" not found in f");
        // A missing default is not an error.
        let config = parse("default_profile = \"gone\"").unwrap();
        assert_eq!(select(&config, None, "f").unwrap(), Profile::default());
    }

    #[test]
    fn rendering_round_trips() {
        let mut config = parse(SAMPLE).unwrap();
        config.profiles.insert(
            "odd \"name\".x\\y".into(),
            Profile {
                endpoint: Some("http://h:1/a\"b#c".into()),
                protocol: Some(Protocol::Pico),
                http2: Some(false),
                token: Some("t\"k".into()),
                ca_cert: Some(PathBuf::from("/etc/pico/ca.pem")),
            },
        );
        config.profiles.insert("empty".into(), Profile::default());
        let text = render(&config);
        assert_eq!(parse(&text).unwrap(), config, "{text}");
        assert!(text.starts_with("default_profile = \"prod\"\n"), "{text}");
        assert!(text.contains("[profiles.prod]\nendpoint = \"http://node2.internal:4437\"\nprotocol = \"ds\"\nhttp2 = true\n"), "{text}");
        assert_eq!(render(&ConfigFile::default()), "");
    }

    #[test]
    fn saving_is_private_and_atomic() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/dir/config.toml");
        let config = parse(SAMPLE).unwrap();
        save(&path, &config).unwrap();
        assert_eq!(load(&path).unwrap(), config);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec!["config.toml"], "no temporary file left");
        assert_eq!(
            load(&dir.path().join("missing.toml")).unwrap(),
            ConfigFile::default()
        );
    }

    #[test]
    fn rejects_what_it_does_not_know() {
        for bad in [
            "colour = \"red\"",
            "[profiles.a]\nendpoint = 3",
            "[profiles.a]\nhttp2 = \"yes\"",
            "[profiles.a]\nprotocol = \"grpc\"",
            "[other]",
            "[profiles.a",
            "default_profile = \"unterminated",
            "just words",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        // One line, naming the line of the file.
        assert_eq!(
            parse("\n\n[profiles.a]\ncolour = 1"),
            Err("line 4: unknown or mistyped key \"colour\"".to_owned())
        );
        assert_eq!(
            parse("[profiles.a]\nprotocol = \"grpc\""),
            Err("line 2: unknown protocol \"grpc\": expected pico or ds".to_owned())
        );
    }
}
