//! Collection profiles: one YAML file per profile in the profiles directory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::*;

pub use ingest_protocol::profile::{Notification, Profile};

/// The collection profiles the server knows.
#[derive(Debug, Clone, Default)]
pub struct Profiles {
    dir: Option<PathBuf>,
    by_name: BTreeMap<String, Profile>,
}

/// A submission named a profile the profiles directory does not have.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown profile {name:?}: the profiles directory {dir} has no such profile")]
pub struct UnknownProfile {
    /// The name given.
    pub name: String,
    /// The profiles directory.
    pub dir: String,
}

impl Profiles {
    /// No profiles directory: any profile name is accepted, none has settings.
    pub fn unrestricted() -> Profiles {
        Profiles::default()
    }

    /// Exactly these profiles (tests, embedding).
    pub fn from_profiles(profiles: impl IntoIterator<Item = Profile>) -> Profiles {
        Profiles {
            dir: Some(PathBuf::from("<in memory>")),
            by_name: profiles.into_iter().map(|p| (p.name.clone(), p)).collect(),
        }
    }

    /// Loads every `*.yaml` / `*.yml` file of `dir` (hidden files skipped),
    /// one profile each.
    ///
    /// # Errors
    /// [`ConfigError`] naming the file and the field: unreadable or
    /// malformed files, invalid values, two files with the same name, or a
    /// directory with no profile at all.
    pub fn load(dir: &Path) -> Result<Profiles, ConfigError> {
        let entries = std::fs::read_dir(dir).map_err(|source| ConfigError::Read {
            what: "profiles directory",
            path: dir.to_path_buf(),
            source,
        })?;
        let mut files = Vec::new();
        for entry in entries {
            let path = entry
                .map_err(|source| ConfigError::Read {
                    what: "profiles directory",
                    path: dir.to_path_buf(),
                    source,
                })?
                .path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            let yaml = matches!(
                path.extension().and_then(|e| e.to_str()),
                Some("yaml" | "yml")
            );
            if yaml && !name.starts_with('.') && path.is_file() {
                files.push(path);
            }
        }
        files.sort();
        let mut by_name: BTreeMap<String, Profile> = BTreeMap::new();
        let mut sources: BTreeMap<String, PathBuf> = BTreeMap::new();
        for path in files {
            let profile = load_profile(&path)?;
            if let Some(first) = sources.get(&profile.name) {
                return Err(invalid(
                    &Origin::Named(format!("profiles directory {}", dir.display())),
                    "name",
                    format!(
                        "profile files {} and {} both define {:?}",
                        first.display(),
                        path.display(),
                        profile.name
                    ),
                ));
            }
            sources.insert(profile.name.clone(), path);
            by_name.insert(profile.name.clone(), profile);
        }
        if by_name.is_empty() {
            return Err(invalid(
                &Origin::Named(format!("profiles directory {}", dir.display())),
                "profiles_dir",
                format!(
                    "{} holds no profile (*.yaml, *.yml); every submission would be refused",
                    dir.display()
                ),
            ));
        }
        Ok(Profiles {
            dir: Some(dir.to_path_buf()),
            by_name,
        })
    }

    /// Whether only the listed profiles are accepted.
    pub fn is_restricted(&self) -> bool {
        self.dir.is_some()
    }

    /// A profile's settings.
    pub fn get(&self, name: &str) -> Option<&Profile> {
        self.by_name.get(name)
    }

    /// Checks a profile name a submission gives.
    ///
    /// # Errors
    /// [`UnknownProfile`] when the set is restricted and has no such profile.
    pub fn check(&self, name: &str) -> Result<Option<&Profile>, UnknownProfile> {
        match (&self.dir, self.by_name.get(name)) {
            (_, Some(p)) => Ok(Some(p)),
            (None, None) => Ok(None),
            (Some(dir), None) => Err(UnknownProfile {
                name: name.to_string(),
                dir: dir.display().to_string(),
            }),
        }
    }

    /// Every profile, by name.
    pub fn iter(&self) -> impl Iterator<Item = &Profile> {
        self.by_name.values()
    }

    /// How many profiles there are.
    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }
}

pub(crate) fn load_profile(path: &Path) -> Result<Profile, ConfigError> {
    let what = "profile file";
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        what,
        path: path.to_path_buf(),
        source,
    })?;
    let p: Profile = serde_norway::from_str(&text).map_err(|e| ConfigError::Parse {
        what,
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    let origin = Origin::Named(format!("profile file {}", path.display()));
    validate_profile(&p).map_err(|(field, reason)| invalid(&origin, field, reason))?;
    Ok(p)
}

pub(crate) fn validate_profile(p: &Profile) -> Result<(), (&'static str, String)> {
    let n = &p.name;
    if n.trim().is_empty() {
        return Err(("name", "is empty".into()));
    }
    if n.len() > 200
        || n == "."
        || n == ".."
        || n.contains('/')
        || n.chars().any(|c| c.is_control() || c.is_whitespace())
    {
        return Err((
            "name",
            format!("{n:?} must be one ZooKeeper path segment: no '/', spaces or control characters, not '.' or '..', at most 200 bytes"),
        ));
    }
    if let Some(pr) = p.priority {
        if pr > ingest_events::command::MAX_PRIORITY {
            return Err(("priority", format!("{pr} is outside 0-99")));
        }
    }
    if let Some(url) = &p.notification.callback_url {
        match reqwest::Url::parse(url) {
            Ok(u) if matches!(u.scheme(), "http" | "https") => {}
            Ok(u) => {
                return Err((
                    "notification.callback_url",
                    format!("{url:?} has scheme {:?}; use http or https", u.scheme()),
                ))
            }
            Err(e) => {
                return Err((
                    "notification.callback_url",
                    format!("{url:?} is not a URL ({e})"),
                ))
            }
        }
    }
    for e in &p.notification.emails {
        let ok = match e.split_once('@') {
            Some((user, domain)) => {
                !user.is_empty()
                    && domain.contains('.')
                    && !domain.contains('@')
                    && !e.chars().any(|c| c.is_whitespace() || c.is_control())
            }
            None => false,
        };
        if !ok {
            return Err((
                "notification.emails",
                format!("{e:?} is not an e-mail address"),
            ));
        }
    }
    Ok(())
}
