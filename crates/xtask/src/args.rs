//! The command line: `build [--debug]` or `install --prefix DIR [--debug]`.

use std::fmt;
use std::path::PathBuf;

pub const USAGE: &str = "\
usage: cargo xtask build [--debug]
       cargo xtask install --prefix DIR [--debug]

build     builds libnccl.so (-p oxccl-nccl) and the oxccl CLI (-p oxccl-cli),
          and adds libnccl.so.2 -> libnccl.so beside the library
install   builds as above, then lays out DIR/bin/oxccl, DIR/lib/libnccl.so.2,
          DIR/lib/libnccl.so -> libnccl.so.2, DIR/include/nccl.h and
          DIR/lib/pkgconfig/nccl.pc
--debug   use the dev profile (target/debug) instead of release";

/// Which cargo profile to build, and so which `target/` subdirectory holds
/// the results.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    Release,
    Debug,
}

impl Profile {
    /// The flag `cargo build` takes for this profile, if any.
    pub fn cargo_flag(self) -> Option<&'static str> {
        match self {
            Profile::Release => Some("--release"),
            Profile::Debug => None,
        }
    }

    /// The directory under `target/` cargo writes this profile's outputs to.
    pub fn dir_name(self) -> &'static str {
        match self {
            Profile::Release => "release",
            Profile::Debug => "debug",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Task {
    Build { profile: Profile },
    Install { prefix: PathBuf, profile: Profile },
    Help,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UsageError {
    NoTask,
    UnknownTask(String),
    UnknownOption { task: &'static str, option: String },
    PrefixWithoutValue,
    PrefixTwice,
    MissingPrefix,
}

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UsageError::NoTask => write!(f, "no task given: expected `build` or `install`"),
            UsageError::UnknownTask(t) => {
                write!(f, "unknown task `{t}`: expected `build` or `install`")
            }
            UsageError::UnknownOption { task, option } => {
                write!(f, "`{task}` does not take `{option}`")
            }
            UsageError::PrefixWithoutValue => write!(f, "--prefix needs a directory"),
            UsageError::PrefixTwice => write!(f, "--prefix given more than once"),
            UsageError::MissingPrefix => write!(f, "install needs --prefix DIR"),
        }
    }
}

/// Parses the arguments after `cargo xtask`.
pub fn parse(args: &[String]) -> Result<Task, UsageError> {
    let Some((task, rest)) = args.split_first() else {
        return Err(UsageError::NoTask);
    };
    match task.as_str() {
        "-h" | "--help" | "help" => Ok(Task::Help),
        "build" => parse_build(rest),
        "install" => parse_install(rest),
        other => Err(UsageError::UnknownTask(other.to_string())),
    }
}

fn parse_build(rest: &[String]) -> Result<Task, UsageError> {
    let mut profile = Profile::Release;
    for arg in rest {
        match arg.as_str() {
            "--debug" => profile = Profile::Debug,
            "-h" | "--help" => return Ok(Task::Help),
            other => {
                return Err(UsageError::UnknownOption {
                    task: "build",
                    option: other.to_string(),
                })
            }
        }
    }
    Ok(Task::Build { profile })
}

fn parse_install(rest: &[String]) -> Result<Task, UsageError> {
    let mut profile = Profile::Release;
    let mut prefix: Option<PathBuf> = None;
    let mut args = rest.iter();
    while let Some(arg) = args.next() {
        let value = match arg.as_str() {
            "--debug" => {
                profile = Profile::Debug;
                continue;
            }
            "-h" | "--help" => return Ok(Task::Help),
            "--prefix" => args.next().ok_or(UsageError::PrefixWithoutValue)?.as_str(),
            other => match other.strip_prefix("--prefix=") {
                Some(value) => value,
                None => {
                    return Err(UsageError::UnknownOption {
                        task: "install",
                        option: other.to_string(),
                    })
                }
            },
        };
        if value.is_empty() {
            return Err(UsageError::PrefixWithoutValue);
        }
        if prefix.replace(PathBuf::from(value)).is_some() {
            return Err(UsageError::PrefixTwice);
        }
    }
    let prefix = prefix.ok_or(UsageError::MissingPrefix)?;
    Ok(Task::Install { prefix, profile })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(line: &str) -> Result<Task, UsageError> {
        let args: Vec<String> = line.split_whitespace().map(String::from).collect();
        parse(&args)
    }

    #[test]
    fn build_defaults_to_release() {
        assert_eq!(
            parse_str("build"),
            Ok(Task::Build {
                profile: Profile::Release
            })
        );
        assert_eq!(
            parse_str("build --debug"),
            Ok(Task::Build {
                profile: Profile::Debug
            })
        );
    }

    #[test]
    fn install_takes_prefix_in_both_spellings() {
        let want = Ok(Task::Install {
            prefix: PathBuf::from("/opt/oxccl"),
            profile: Profile::Debug,
        });
        assert_eq!(parse_str("install --prefix /opt/oxccl --debug"), want);
        assert_eq!(parse_str("install --debug --prefix=/opt/oxccl"), want);
    }

    #[test]
    fn install_errors_name_the_problem() {
        assert_eq!(parse_str("install"), Err(UsageError::MissingPrefix));
        assert_eq!(
            parse_str("install --prefix"),
            Err(UsageError::PrefixWithoutValue)
        );
        assert_eq!(
            parse_str("install --prefix="),
            Err(UsageError::PrefixWithoutValue)
        );
        assert_eq!(
            parse_str("install --prefix a --prefix b"),
            Err(UsageError::PrefixTwice)
        );
        assert_eq!(
            parse_str("install --prefix a --strip"),
            Err(UsageError::UnknownOption {
                task: "install",
                option: "--strip".into()
            })
        );
    }

    #[test]
    fn unknown_or_missing_task_is_refused() {
        assert_eq!(parse_str(""), Err(UsageError::NoTask));
        assert_eq!(
            parse_str("dist"),
            Err(UsageError::UnknownTask("dist".into()))
        );
        assert_eq!(
            parse_str("build --prefix x"),
            Err(UsageError::UnknownOption {
                task: "build",
                option: "--prefix".into()
            })
        );
        assert_eq!(parse_str("--help"), Ok(Task::Help));
    }
}
