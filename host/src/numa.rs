//! NUMA placement without libnuma: the CPUs of a node come from
//! `/sys/devices/system/node/node<N>/cpulist`, and a thread is bound with `sched_setaffinity`.

use crate::error::{Error, NumaError, Result};

/// Parses a sysfs CPU list such as `0-3,8,10-11`.
pub fn parse_cpu_list(s: &str) -> Option<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.parse().ok()?, b.parse().ok()?);
                if b < a || b - a > 1 << 16 {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.parse().ok()?),
        }
    }
    Some(cpus)
}

/// CPUs of NUMA node `node`.
pub fn node_cpus(node: u32) -> Result<Vec<usize>> {
    let path = format!("/sys/devices/system/node/node{node}/cpulist");
    let text = std::fs::read_to_string(&path).map_err(|source| Error::ReadFile {
        path: path.clone().into(),
        source,
    })?;
    parse_cpu_list(&text).ok_or_else(|| {
        NumaError::CpuList {
            node,
            path: path.into(),
            text,
        }
        .into()
    })
}

/// Binds the calling thread to the CPUs of `node`.
pub fn bind_current_thread(node: u32) -> Result<()> {
    let cpus = node_cpus(node)?;
    // SAFETY: `cpu_set_t` is plain data; zeroed is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let max = 8 * std::mem::size_of::<libc::cpu_set_t>();
    for &c in cpus.iter().filter(|&&c| c < max) {
        // SAFETY: `c` is below the set's capacity.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: `set` is a valid CPU set of the size passed; 0 means the calling thread.
    if unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) } != 0 {
        return Err(NumaError::Bind {
            node,
            source: std::io::Error::last_os_error(),
        }
        .into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(
            parse_cpu_list("0-3,8,10-11\n"),
            Some(vec![0, 1, 2, 3, 8, 10, 11])
        );
        assert_eq!(parse_cpu_list("5"), Some(vec![5]));
        assert_eq!(parse_cpu_list(""), Some(vec![]));
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("a-b"), None);
    }

    #[test]
    fn node0_binding_works_where_sysfs_has_it() {
        if std::path::Path::new("/sys/devices/system/node/node0/cpulist").exists() {
            bind_current_thread(0).unwrap();
        } else {
            assert!(bind_current_thread(0).is_err());
        }
    }
}
