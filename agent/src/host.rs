//! What the robot reports about itself: its hardware at registration and
//! its usage in every heartbeat.

use std::path::{Path, PathBuf};

use k8s4r_api::{DeviceInfo, Usage};
use sysinfo::{CpuRefreshKind, MemoryRefreshKind, RefreshKind, System};

/// Total and free bytes of the filesystem holding `path`.
pub fn disk_space(path: &Path) -> Option<(u64, u64)> {
    let stat = nix::sys::statvfs::statvfs(path).ok()?;
    let frag = stat.fragment_size() as u64;
    Some((
        (stat.blocks() as u64).saturating_mul(frag),
        (stat.blocks_available() as u64).saturating_mul(frag),
    ))
}

/// Samples usage figures; keeps the previous CPU reading so that each
/// heartbeat reports the CPU use since the one before.
#[derive(Debug)]
pub struct UsageSampler {
    system: System,
    state_dir: PathBuf,
}

impl UsageSampler {
    /// A sampler for the disk of `state_dir`.
    pub fn new(state_dir: &Path) -> Self {
        // Only CPU and memory: the process list would cost memory and time
        // the agent does not need.
        let system = System::new_with_specifics(
            RefreshKind::nothing()
                .with_cpu(CpuRefreshKind::nothing().with_cpu_usage())
                .with_memory(MemoryRefreshKind::nothing().with_ram()),
        );
        Self {
            system,
            state_dir: state_dir.to_owned(),
        }
    }

    /// The robot's hardware and operating system.
    pub fn device_info(&mut self) -> DeviceInfo {
        self.system
            .refresh_memory_specifics(MemoryRefreshKind::nothing().with_ram());
        let cpus = std::thread::available_parallelism()
            .map(|n| n.get() as u32)
            .unwrap_or(self.system.cpus().len() as u32);
        DeviceInfo {
            arch: std::env::consts::ARCH.to_owned(),
            os: std::env::consts::OS.to_owned(),
            os_version: System::long_os_version(),
            kernel: System::kernel_version(),
            hostname: System::host_name(),
            cpus,
            memory_bytes: self.system.total_memory(),
            disk_bytes: disk_space(&self.state_dir).map_or(0, |(total, _)| total),
        }
    }

    /// Usage now.
    pub fn sample(&mut self) -> Usage {
        self.system.refresh_cpu_usage();
        self.system
            .refresh_memory_specifics(MemoryRefreshKind::nothing().with_ram());
        let load = System::load_average();
        Usage {
            // Tenths of a point: the full f32 costs a dozen digits a heartbeat.
            cpu_percent: (f64::from(self.system.global_cpu_usage()).clamp(0.0, 100.0) * 10.0).round() / 10.0,
            memory_used_bytes: self.system.used_memory(),
            memory_total_bytes: self.system.total_memory(),
            disk_free_bytes: disk_space(&self.state_dir).map_or(0, |(_, free)| free),
            load1: load.one,
            load5: load.five,
            load15: load.fifteen,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_this_machine() {
        let dir = std::env::temp_dir();
        let mut s = UsageSampler::new(&dir);
        let d = s.device_info();
        assert_eq!(d.arch, std::env::consts::ARCH);
        assert!(d.cpus >= 1 && d.memory_bytes > 0 && d.disk_bytes > 0, "{d:?}");
        let u = s.sample();
        assert!(
            u.memory_total_bytes > 0 && u.memory_used_bytes <= u.memory_total_bytes,
            "{u:?}"
        );
        assert!((0.0..=100.0).contains(&u.cpu_percent), "{u:?}");
        assert!(u.disk_free_bytes > 0, "{u:?}");
    }
}
