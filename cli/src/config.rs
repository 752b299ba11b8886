//! `serve` configuration: defaults, then a TOML file, then `HOOKLANE_*` variables (which win).

use std::{collections::HashMap, net::SocketAddr, path::PathBuf, time::Duration};

use hooklane::{
    config::{parse_duration, CORE_SETTINGS},
    CoreConfig,
};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    File { path: PathBuf, message: String },
    #[error("{name}: {message}")]
    Value { name: String, message: String },
}

/// Every setting of `serve`, as the file spells them (the variables are `HOOKLANE_` + upper case).
pub const SETTINGS: [&str; 24] = [
    "listen",
    "database",
    "admin_token",
    "workers",
    "allow_cidrs",
    "https_only",
    "retry_schedule",
    "disable_after",
    "operations_account",
    "sweep_interval",
    "health_interval",
    "purge_interval",
    "log_format",
    "smtp_url",
    "smtp_from",
    "max_payload",
    "publish_rate",
    "publish_burst",
    "retention",
    "secrets_key",
    "secrets_key_previous",
    "public_url",
    "strict_event_types",
    "max_endpoints",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub listen: SocketAddr,
    pub database: PathBuf,
    pub admin_token: Option<String>,
    pub workers: usize,
    pub sweep_interval: Duration,
    pub health_interval: Duration,
    /// How often what is past `HOOKLANE_RETENTION` is removed.
    pub purge_interval: Duration,
    pub log_format: LogFormat,
    /// Owner mail goes through this relay; without it, to the log.
    pub smtp: Option<SmtpSettings>,
    pub core: CoreConfig,
}

#[derive(Debug, Clone)]
pub struct SmtpSettings {
    pub url: String,
    pub from: String,
}

impl ServeConfig {
    /// Reads the optional file, then the environment given as `vars`.
    pub fn load(
        file: Option<&std::path::Path>,
        vars: &HashMap<String, String>,
    ) -> Result<Self, ConfigError> {
        let mut settings: HashMap<&'static str, String> = HashMap::new();
        if let Some(path) = file {
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                path: path.to_owned(),
                source,
            })?;
            let table: toml::Table = toml::from_str(&text).map_err(|e| ConfigError::File {
                path: path.to_owned(),
                message: e.to_string(),
            })?;
            // Values may be written as TOML numbers or booleans too; they are read as text.
            for (key, value) in table {
                let Some(name) = SETTINGS.iter().copied().find(|name| *name == key) else {
                    return Err(ConfigError::File {
                        path: path.to_owned(),
                        message: format!(
                            "unknown setting `{key}`, expected one of {}",
                            SETTINGS.join(", ")
                        ),
                    });
                };
                let text = match value {
                    toml::Value::String(s) => s,
                    toml::Value::Array(items) => items
                        .iter()
                        .map(|v| {
                            v.as_str()
                                .map(str::to_owned)
                                .unwrap_or_else(|| v.to_string())
                        })
                        .collect::<Vec<_>>()
                        .join(","),
                    other => other.to_string(),
                };
                settings.insert(name, text);
            }
        }
        for name in SETTINGS {
            if let Some(value) = vars.get(&format!("HOOKLANE_{}", name.to_ascii_uppercase())) {
                settings.insert(name, value.clone());
            }
        }
        Self::from_settings(&settings)
    }

    fn from_settings(settings: &HashMap<&'static str, String>) -> Result<Self, ConfigError> {
        let get = |name: &str| {
            settings
                .get(name)
                .map(|v| v.trim())
                .filter(|v| !v.is_empty())
        };
        let invalid = |name: &str, message: String| ConfigError::Value {
            name: format!("HOOKLANE_{}", name.to_ascii_uppercase()),
            message,
        };
        let listen = get("listen")
            .unwrap_or("127.0.0.1:8080")
            .parse()
            .map_err(|e| invalid("listen", format!("not an address like 127.0.0.1:8080: {e}")))?;
        let workers = match get("workers") {
            Some(raw) => raw
                .parse::<usize>()
                .ok()
                .filter(|w| (1..=10_000).contains(w))
                .ok_or_else(|| invalid("workers", "must be a number from 1 to 10000".into()))?,
            None => 64,
        };
        let core = CoreConfig::default()
            .with_settings(|variable| {
                CORE_SETTINGS
                    .iter()
                    .find(|(_, v)| *v == variable)
                    .and_then(|(name, _)| get(name))
            })
            .map_err(|e| ConfigError::Value {
                name: e.field.into_owned(),
                message: e.message,
            })?;
        let duration_or =
            |name: &'static str, default: Duration| -> Result<Duration, ConfigError> {
                match get(name) {
                    Some(raw) => parse_duration(raw, name)
                        .map_err(|e| invalid(name, e.message))
                        .and_then(|d| {
                            if d.is_zero() {
                                Err(invalid(name, "must be above zero".into()))
                            } else {
                                Ok(d)
                            }
                        }),
                    None => Ok(default),
                }
            };
        // Health is checked often enough to honour short thresholds in tests.
        let health_default =
            (core.disable_after / 10).clamp(Duration::from_millis(200), Duration::from_secs(60));
        let log_format = match get("log_format") {
            None | Some("text") => LogFormat::Text,
            Some("json") => LogFormat::Json,
            Some(other) => {
                return Err(invalid(
                    "log_format",
                    format!("`{other}` is not text or json"),
                ))
            }
        };
        Ok(Self {
            listen,
            database: PathBuf::from(get("database").unwrap_or("./hooklane.db")),
            admin_token: get("admin_token").map(str::to_owned),
            workers,
            sweep_interval: duration_or("sweep_interval", Duration::from_secs(60))?,
            health_interval: duration_or("health_interval", health_default)?,
            purge_interval: duration_or("purge_interval", Duration::from_secs(60))?,
            log_format,
            smtp: get("smtp_url").map(|url| SmtpSettings {
                url: url.to_owned(),
                from: get("smtp_from")
                    .unwrap_or("Hooklane <hooklane@localhost>")
                    .to_owned(),
            }),
            core,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hooklane::domain::RetrySchedule;
    use hooklane_testkit::fixtures::environment;

    #[test]
    fn defaults() {
        let config = ServeConfig::load(None, &HashMap::new()).unwrap();
        assert_eq!(config.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(config.workers, 64);
        assert_eq!(config.core.retry.schedule, RetrySchedule::default());
        assert_eq!(config.core.disable_after, Duration::from_secs(3 * 86_400));
        assert!(config.core.sender.policy.allow_list().is_empty());
        assert_eq!(config.purge_interval, Duration::from_secs(60));
    }

    #[test]
    fn the_purge_runs_as_often_as_configured() {
        let config =
            ServeConfig::load(None, &environment(&[("HOOKLANE_PURGE_INTERVAL", "5s")])).unwrap();
        assert_eq!(config.purge_interval, Duration::from_secs(5));
        let err = ServeConfig::load(None, &environment(&[("HOOKLANE_PURGE_INTERVAL", "0s")]))
            .unwrap_err();
        assert!(
            err.to_string().starts_with("HOOKLANE_PURGE_INTERVAL"),
            "{err}"
        );
    }

    #[test]
    fn environment_wins_over_file() {
        let dir = std::env::temp_dir().join(format!("hooklane-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("hooklane.toml");
        std::fs::write(
            &file,
            "workers = 8\nretry_schedule = [1, 2]\nlisten = \"127.0.0.1:9000\"\n",
        )
        .unwrap();
        let config = ServeConfig::load(
            Some(&file),
            &environment(&[
                ("HOOKLANE_WORKERS", "20"),
                ("HOOKLANE_ALLOW_CIDRS", "127.0.0.0/8, ::1"),
            ]),
        )
        .unwrap();
        assert_eq!(config.workers, 20);
        assert_eq!(config.listen.to_string(), "127.0.0.1:9000");
        assert_eq!(
            config.core.retry.schedule.delays(),
            &[Duration::from_secs(1), Duration::from_secs(2)]
        );
        assert_eq!(config.core.sender.policy.allow_list().len(), 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The file takes every setting the environment does (the README's promise), and names
    /// a key it does not know.
    #[test]
    fn the_file_takes_every_setting() {
        let dir = std::env::temp_dir().join(format!("hooklane-every-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("hooklane.toml");
        std::fs::write(&file, "max_endpoints = 5\nstrict_event_types = true\n").unwrap();
        let config = ServeConfig::load(Some(&file), &environment(&[])).unwrap();
        assert_eq!(config.core.max_endpoints, 5);
        assert!(config.core.strict_event_types);
        // Each one is at least taken as a key (a bad value is named by its variable).
        for name in SETTINGS {
            std::fs::write(&file, format!("{name} = \"\"\n")).unwrap();
            if let Err(error) = ServeConfig::load(Some(&file), &environment(&[])) {
                assert!(!error.to_string().contains("unknown"), "{name}: {error}");
            }
        }
        std::fs::write(&file, "max_endpoint = 5\n").unwrap();
        let error = ServeConfig::load(Some(&file), &environment(&[])).unwrap_err();
        assert!(error.to_string().contains("max_endpoint"), "{error}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn bad_values_name_the_variable() {
        let err =
            ServeConfig::load(None, &environment(&[("HOOKLANE_WORKERS", "lots")])).unwrap_err();
        assert!(err.to_string().starts_with("HOOKLANE_WORKERS"), "{err}");
        let err = ServeConfig::load(
            None,
            &environment(&[("HOOKLANE_ALLOW_CIDRS", "10.0.0.0/99")]),
        )
        .unwrap_err();
        assert!(err.to_string().contains("HOOKLANE_ALLOW_CIDRS"), "{err}");
        let err = ServeConfig::load(None, &environment(&[("HOOKLANE_DISABLE_AFTER", "soon")]))
            .unwrap_err();
        assert!(err.to_string().contains("HOOKLANE_DISABLE_AFTER"), "{err}");
        let err =
            ServeConfig::load(None, &environment(&[("HOOKLANE_HTTPS_ONLY", "yes")])).unwrap_err();
        assert!(err.to_string().starts_with("HOOKLANE_HTTPS_ONLY"), "{err}");
        let config =
            ServeConfig::load(None, &environment(&[("HOOKLANE_HTTPS_ONLY", "1")])).unwrap();
        assert!(config.core.sender.policy.https_only());
        let err =
            ServeConfig::load(None, &environment(&[("HOOKLANE_PUBLISH_RATE", "x")])).unwrap_err();
        assert!(
            err.to_string().starts_with("HOOKLANE_PUBLISH_RATE"),
            "{err}"
        );
        let config = ServeConfig::load(
            None,
            &environment(&[
                ("HOOKLANE_PUBLISH_RATE", "5"),
                ("HOOKLANE_MAX_PAYLOAD", "1MiB"),
            ]),
        )
        .unwrap();
        assert_eq!(config.core.max_payload_bytes, 1 << 20);
        assert_eq!(config.core.publish_rate.map(|r| r.burst), Some(5));
    }

    /// Every core setting can be given to `serve`, in the file and in the environment.
    #[test]
    fn serve_reads_every_core_setting() {
        for (name, variable) in CORE_SETTINGS {
            assert!(SETTINGS.contains(&name), "{name} is not read by serve");
            assert_eq!(variable, format!("HOOKLANE_{}", name.to_ascii_uppercase()));
        }
    }

    #[test]
    fn the_secrets_keys_come_from_the_file_or_the_environment() {
        let (current, previous) = ("ab".repeat(32), "cd".repeat(32));
        let config = ServeConfig::load(
            None,
            &environment(&[
                ("HOOKLANE_SECRETS_KEY", &current),
                ("HOOKLANE_SECRETS_KEY_PREVIOUS", &previous),
            ]),
        )
        .unwrap();
        assert_eq!(config.core.secrets.current, Some([0xab; 32]));
        assert_eq!(config.core.secrets.previous, Some([0xcd; 32]));
        let dir = std::env::temp_dir().join(format!("hooklane-config-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("hooklane.toml");
        std::fs::write(&file, format!("secrets_key = \"{current}\"\n")).unwrap();
        let config = ServeConfig::load(Some(&file), &HashMap::new()).unwrap();
        assert_eq!(config.core.secrets.current, Some([0xab; 32]));
        let err = ServeConfig::load(None, &environment(&[("HOOKLANE_SECRETS_KEY", "short")]))
            .unwrap_err();
        assert!(err.to_string().starts_with("HOOKLANE_SECRETS_KEY"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
