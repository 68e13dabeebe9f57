//! The version `nccl.h` claims, and the `nccl.pc` that advertises it.

use std::fmt;
use std::path::Path;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NcclVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl fmt::Display for NcclVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PkgConfigError {
    /// The header has no `#define NAME <number>` line for this macro.
    MissingDefine(&'static str),
    /// pkg-config splits `Libs:`/`Cflags:` at whitespace and reads text only,
    /// so the prefix must be UTF-8 without whitespace.
    UnusablePrefix(String),
}

impl fmt::Display for PkgConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PkgConfigError::MissingDefine(name) => {
                write!(f, "nccl.h has no numeric `#define {name}`")
            }
            PkgConfigError::UnusablePrefix(p) => write!(
                f,
                "--prefix {p:?} cannot go into nccl.pc: pkg-config needs a UTF-8 path without whitespace"
            ),
        }
    }
}

/// Reads `NCCL_MAJOR`, `NCCL_MINOR` and `NCCL_PATCH` from the text of `nccl.h`.
pub fn header_version(header: &str) -> Result<NcclVersion, PkgConfigError> {
    Ok(NcclVersion {
        major: define_number(header, "NCCL_MAJOR")?,
        minor: define_number(header, "NCCL_MINOR")?,
        patch: define_number(header, "NCCL_PATCH")?,
    })
}

fn define_number(header: &str, name: &'static str) -> Result<u32, PkgConfigError> {
    header
        .lines()
        .find_map(|line| {
            let mut words = line.split_whitespace();
            match (words.next(), words.next(), words.next()) {
                (Some("#define"), Some(n), Some(value)) if n == name => value.parse().ok(),
                _ => None,
            }
        })
        .ok_or(PkgConfigError::MissingDefine(name))
}

/// The `nccl.pc` for an install under `prefix`, with the variables and
/// fields NCCL's own packages provide, so `pkg-config --cflags --libs nccl`
/// gives the same flags for either.
pub fn pc_text(prefix: &Path, version: NcclVersion) -> Result<String, PkgConfigError> {
    let prefix = prefix
        .to_str()
        .filter(|p| !p.chars().any(char::is_whitespace))
        .ok_or_else(|| PkgConfigError::UnusablePrefix(prefix.display().to_string()))?;
    Ok(format!(
        "prefix={prefix}\n\
         exec_prefix=${{prefix}}\n\
         libdir=${{exec_prefix}}/lib\n\
         includedir=${{prefix}}/include\n\
         \n\
         Name: nccl\n\
         Description: oxccl, a Rust implementation of the NCCL collective communication library\n\
         Version: {version}\n\
         Libs: -L${{libdir}} -lnccl\n\
         Cflags: -I${{includedir}}\n"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = "#ifndef NCCL_H_\n#define NCCL_MAJOR 2\n#define NCCL_MINOR 27\n\
                          #define NCCL_PATCH 5\n#define NCCL_SUFFIX \"\"\n";

    #[test]
    fn version_comes_from_the_defines() {
        let v = header_version(HEADER).unwrap();
        assert_eq!(
            v,
            NcclVersion {
                major: 2,
                minor: 27,
                patch: 5
            }
        );
        assert_eq!(v.to_string(), "2.27.5");
    }

    #[test]
    fn a_missing_define_is_named() {
        let no_patch = HEADER.replace("#define NCCL_PATCH 5", "");
        assert_eq!(
            header_version(&no_patch),
            Err(PkgConfigError::MissingDefine("NCCL_PATCH"))
        );
    }

    #[test]
    fn the_shipped_header_has_a_version() {
        let header = include_str!("../../oxccl-nccl/include/nccl.h");
        let v = header_version(header).unwrap();
        let code = define_number(header, "NCCL_VERSION_CODE").unwrap();
        assert_eq!(v.major * 10000 + v.minor * 100 + v.patch, code);
    }

    #[test]
    fn pc_file_has_nccls_fields() {
        let v = header_version(HEADER).unwrap();
        let pc = pc_text(Path::new("/opt/nccl"), v).unwrap();
        for line in [
            "prefix=/opt/nccl",
            "libdir=${exec_prefix}/lib",
            "includedir=${prefix}/include",
            "Name: nccl",
            "Version: 2.27.5",
            "Libs: -L${libdir} -lnccl",
            "Cflags: -I${includedir}",
        ] {
            assert!(pc.lines().any(|l| l == line), "{line:?} not in\n{pc}");
        }
    }

    #[test]
    fn pc_refuses_a_prefix_with_spaces() {
        let v = header_version(HEADER).unwrap();
        assert!(matches!(
            pc_text(Path::new("/opt/my nccl"), v),
            Err(PkgConfigError::UnusablePrefix(_))
        ));
    }
}
