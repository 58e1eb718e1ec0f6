//! `mscclpp-info`: which backend and devices this machine offers, a self-check that the
//! embedded kernels run on them (a copy and a shared-memory reduction, checked on the host),
//! and the transports between nodes: the libfabric providers found (or why none) and what the
//! collectives of a world of several nodes would use.
//! `MSCCLPP_LOG` shows the library's `tracing` events (warnings by default).

use std::process::ExitCode;

use mscclpp::host::gpu::{BackendKind, Gpu, LaunchConfig};
use mscclpp::kernels;
use mscclpp::shared::{BlockSumParams, CopyParams, DevicePtr};

fn main() -> ExitCode {
    mscclpp_tools::init_logging("mscclpp-info");
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mscclpp-info: {e}");
            let mut src = e.source();
            while let Some(s) = src {
                eprintln!("  caused by: {s}");
                src = s.source();
            }
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let kind = BackendKind::select()?;
    let count = kind.device_count()?;
    println!("backend: {kind:?}, {count} device(s)");
    if kind == BackendKind::Cpu {
        println!("note: this is the CPU backend (no GPU found): same kernels, on threads");
    }
    let entries = mscclpp::DEVICE_PTX.matches(".entry ").count();
    println!(
        "embedded PTX: {} bytes, {entries} kernels, {}",
        mscclpp::DEVICE_PTX.len(),
        mscclpp::DEVICE_PTX
            .lines()
            .find(|l| l.starts_with(".target"))
            .unwrap_or(".target ?")
    );
    // What one rank's collectives allocate (this backend's default configuration).
    let cfg = mscclpp::collectives::CollectiveConfig::for_backend(kind).with_env();
    for ranks in [2, 8] {
        let plan = mscclpp::collectives::memory_plan(&cfg, ranks);
        let mib = |b: usize| b as f64 / (1 << 20) as f64;
        let later: Vec<String> = plan
            .on_first_use
            .iter()
            .map(|(what, who, b)| format!("+{:.1} MiB {what} on the first {who} call", mib(*b)))
            .collect();
        println!(
            "collectives on {ranks} ranks: {:.2} MiB of device memory per rank at set-up; {}",
            mib(plan.at_creation),
            later.join("; ")
        );
    }
    for ordinal in 0..count.min(8) {
        let g = Gpu::open(kind, ordinal)?;
        let t = std::time::Instant::now();
        self_check(&g)?;
        println!(
            "device {ordinal}: {} (numa node {}): self-check passed in {:.1} ms",
            g.name(),
            g.numa_node().map_or("?".to_string(), |n| n.to_string()),
            t.elapsed().as_secs_f64() * 1e3
        );
    }
    networks();
    Ok(())
}

/// The transports between nodes: libfabric's providers and the automatic choice.
fn networks() {
    use mscclpp::host::connection::ofi;
    match ofi::providers() {
        Ok(list) if list.is_empty() => {
            println!("libfabric: loaded, but no provider offers RDM endpoints with RMA writes")
        }
        Ok(list) => {
            println!("libfabric providers (RDM, tagged messages, RMA writes):");
            for p in list {
                println!(
                    "  {:<16} fabric {:<20} domain {:<10} {}{}{}",
                    p.provider,
                    p.fabric,
                    p.domain,
                    if p.ordered {
                        "direct RMA"
                    } else {
                        "messages only"
                    },
                    if p.hmem { ", GPU memory (FI_HMEM)" } else { "" },
                    if p.left_out {
                        " (not chosen unless MSCCLPP_OFI_PROVIDER names it)"
                    } else {
                        ""
                    },
                );
            }
        }
        Err(e) => println!("libfabric: {e}"),
    }
    match ofi::usable() {
        Ok(p) => println!("libfabric provider chosen: {p}"),
        Err(e) => println!("libfabric provider chosen: none ({e})"),
    }
    let order: Vec<String> = mscclpp::collectives::network_transports()
        .iter()
        .map(|t| t.to_string())
        .collect();
    println!(
        "between nodes, collectives use the first of {} that both ranks offer ({} overrides)",
        order.join(", "),
        mscclpp::collectives::ENV_NET_TRANSPORT
    );
}

fn self_check(g: &Gpu) -> Result<(), Box<dyn std::error::Error>> {
    let m = g.load_ptx(mscclpp::DEVICE_PTX)?;
    let stream = g.stream()?;
    let (grid, block, n) = (4u32, 64u32, 4099u32);
    let input: Vec<u32> = (0..grid * n).map(|i| i ^ 0x5a5a).collect();
    let a = g.alloc(input.len() * 4)?;
    let b = g.alloc(input.len() * 4)?;
    let sums = g.alloc(grid as usize * 4)?;
    a.copy_from_host(0, bytemuck::cast_slice(&input))?;
    let copy = m.kernel(kernels::COPY)?;
    let sum = m.kernel(kernels::BLOCK_SUM)?;
    // SAFETY: every address points into the live buffers above, sized as the kernels expect.
    unsafe {
        stream.launch(
            &copy,
            LaunchConfig::new(grid, block),
            CopyParams {
                status: DevicePtr::NULL,
                dst: b.ptr(),
                src: a.ptr(),
                bytes: a.len() as u64,
            },
        )?;
        stream.launch(
            &sum,
            LaunchConfig::new(grid, block).with_shared_mem(block * 4),
            BlockSumParams {
                status: DevicePtr::NULL,
                input: b.ptr().cast(),
                output: sums.ptr().cast(),
                n_per_block: n,
                reserved: 0,
            },
        )?;
    }
    stream.synchronize()?;
    let mut got = vec![0u32; grid as usize];
    sums.copy_to_host(0, bytemuck::cast_slice_mut(&mut got))?;
    let want: Vec<u32> = input
        .chunks(n as usize)
        .map(|c| c.iter().fold(0u32, |s, &x| s.wrapping_add(x)))
        .collect();
    if got != want {
        return Err(format!("block sums are {got:?}, the host computed {want:?}").into());
    }
    Ok(())
}
