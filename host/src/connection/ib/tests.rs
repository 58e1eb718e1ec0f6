//! Unit tests of the `Ib` transport that need no RDMA hardware.

use super::setup::{QpState, check_compatible, gid_index, select_device, transition};
use super::wire::{MAX_MRS, MR_ENTRY_LEN, MrEntry, QP_INFO_HEADER, QpInfo};
use super::{sys, verbs};
use crate::error::{Error, TransportErrorKind};
use crate::transport::Transport;

fn info() -> QpInfo {
    QpInfo {
        link_layer: sys::IBV_LINK_LAYER_ETHERNET,
        port: 1,
        mtu: 5,
        lid: 0,
        qpn: 0x12_3456,
        psn: 0xab_cdef,
        gid: [0xfe; 16],
        mrs: vec![
            MrEntry {
                id: 0,
                addr: 0x7f00_0000_0000,
                size: 4096,
                rkey: 7,
            },
            MrEntry {
                id: 3,
                addr: 0x1000,
                size: 1,
                rkey: 9,
            },
        ],
    }
}

#[test]
fn qp_info_round_trip_and_rejection() {
    let i = info();
    let b = i.encode();
    assert_eq!(b.len(), QP_INFO_HEADER + 2 * MR_ENTRY_LEN);
    assert_eq!(QpInfo::decode(&b).unwrap(), i);
    for cut in 0..b.len() {
        assert!(QpInfo::decode(&b[..cut]).is_err(), "truncated at {cut}");
    }
    let mut long = b.clone();
    long.push(0);
    assert!(QpInfo::decode(&long).is_err());
    let bad = |f: &dyn Fn(&mut QpInfo)| {
        let mut x = info();
        f(&mut x);
        QpInfo::decode(&x.encode())
    };
    assert!(bad(&|x| x.link_layer = 3).is_err());
    assert!(bad(&|x| x.mtu = 0).is_err());
    assert!(bad(&|x| x.mtu = 6).is_err());
    assert!(bad(&|x| x.port = 0).is_err());
    assert!(bad(&|x| x.qpn = 1 << 24).is_err());
    assert!(bad(&|x| x.psn = u32::MAX).is_err());
    assert!(bad(&|x| x.gid = [0; 16]).is_err(), "RoCE without GID");
    assert!(
        bad(&|x| {
            x.gid = [0; 16];
            x.link_layer = sys::IBV_LINK_LAYER_INFINIBAND;
            x.lid = 5;
        })
        .is_ok()
    );
    assert!(bad(&|x| x.mrs[1].size = 0).is_err());
    assert!(bad(&|x| x.mrs[1].addr = u64::MAX).is_err());
    assert!(bad(&|x| x.mrs[1].id = 0).is_err(), "duplicate id");
    let mut b2 = info().encode();
    b2[0] = b'X';
    assert!(QpInfo::decode(&b2).is_err());
    let mut b3 = info().encode();
    b3[4] = 9; // version
    assert!(QpInfo::decode(&b3).is_err());
    let mut b4 = info().encode();
    b4[9] = 1; // reserved
    assert!(QpInfo::decode(&b4).is_err());
    // A full table fits an endpoint (with the communicator's status byte).
    let mut full = info();
    full.mrs = (0..MAX_MRS as u32)
        .map(|id| MrEntry {
            id,
            addr: 4096 * u64::from(id + 1),
            size: 4096,
            rkey: id,
        })
        .collect();
    let enc = full.encode();
    assert!(
        enc.len() < super::super::Endpoint::MAX_EXTRA,
        "room for the status byte"
    );
    assert_eq!(QpInfo::decode(&enc).unwrap(), full);
    let mut over = enc;
    let count_at = QP_INFO_HEADER - 2;
    over[count_at..count_at + 2].copy_from_slice(&(MAX_MRS as u16 + 1).to_le_bytes());
    assert!(QpInfo::decode(&over).is_err());
}

#[test]
fn device_selection() {
    let present = vec!["mlx5_0".to_string(), "mlx5_1".to_string()];
    assert_eq!(select_device(&present, None, 0), Ok(("mlx5_0".into(), 1)));
    assert_eq!(select_device(&present, None, 1), Ok(("mlx5_1".into(), 1)));
    assert!(select_device(&present, None, 2).is_err());
    assert!(
        select_device(&[], None, 0)
            .unwrap_err()
            .contains("no RDMA device")
    );
    assert_eq!(
        select_device(&present, Some("mlx5_1:2"), 0),
        Ok(("mlx5_1".into(), 2))
    );
    assert_eq!(
        select_device(&present, Some("mlx5_1:2"), 5),
        Ok(("mlx5_1".into(), 2)),
        "one entry serves every index"
    );
    assert_eq!(
        select_device(&present, Some(" mlx5_1 , mlx5_0:1 "), 1),
        Ok(("mlx5_0".into(), 1))
    );
    assert!(select_device(&present, Some("mlx5_1,mlx5_0"), 2).is_err());
    assert!(select_device(&present, Some("mlx5_9"), 0).is_err());
    assert!(select_device(&present, Some("mlx5_0:0"), 0).is_err());
    assert!(select_device(&present, Some("mlx5_0:x"), 0).is_err());
    assert_eq!(
        select_device(&present, Some(""), 0),
        Ok(("mlx5_0".into(), 1))
    );
    assert_eq!(gid_index(None), Ok(0));
    assert_eq!(gid_index(Some(" 3 ")), Ok(3));
    assert!(gid_index(Some("-1")).is_err());
    assert!(gid_index(Some("256")).is_err());
}

#[test]
fn qp_transitions_go_reset_init_rtr_rts_and_stop() {
    let local = info();
    let mut remote = info();
    remote.qpn = 77;
    remote.psn = 55;
    remote.mtu = 3;
    remote.gid = [1; 16];
    let mut s = QpState::Reset;
    let mut seen = vec![];
    while let Some((next, attr, mask)) = transition(s, &local, &remote, 3) {
        assert!(next > s);
        assert_ne!(mask & sys::IBV_QP_STATE, 0);
        match next {
            QpState::Init => {
                assert_eq!(attr.qp_state, sys::IBV_QPS_INIT);
                assert_eq!(attr.port_num, 1);
                assert_ne!(
                    attr.qp_access_flags & sys::IBV_ACCESS_REMOTE_ATOMIC as u32,
                    0
                );
            }
            QpState::Rtr => {
                assert_eq!(attr.qp_state, sys::IBV_QPS_RTR);
                assert_eq!((attr.dest_qp_num, attr.rq_psn), (77, 55));
                assert_eq!(attr.path_mtu, 3, "the smaller MTU");
                assert_eq!(attr.ah_attr.is_global, 1, "RoCE routes by GID");
                assert_eq!(attr.ah_attr.grh.dgid.raw, [1; 16]);
                assert_eq!(attr.ah_attr.grh.sgid_index, 3);
                assert_ne!(mask & sys::IBV_QP_AV, 0);
            }
            QpState::Rts => {
                assert_eq!(attr.qp_state, sys::IBV_QPS_RTS);
                assert_eq!(attr.sq_psn, local.psn);
                assert_ne!(mask & sys::IBV_QP_SQ_PSN, 0);
            }
            QpState::Reset => unreachable!(),
        }
        seen.push(next);
        s = next;
    }
    assert_eq!(seen, [QpState::Init, QpState::Rtr, QpState::Rts]);
    let mut ib = info();
    ib.link_layer = sys::IBV_LINK_LAYER_INFINIBAND;
    ib.lid = 4;
    let (_, rtr, _) = transition(QpState::Init, &ib, &ib, 0).unwrap();
    assert_eq!((rtr.ah_attr.is_global, rtr.ah_attr.dlid), (0, 4));
    assert!(check_compatible(&ib, &info()).is_err(), "IB vs RoCE");
    let mut no_lid = ib.clone();
    no_lid.lid = 0;
    assert!(check_compatible(&ib, &no_lid).is_err());
    assert!(check_compatible(&info(), &info()).is_ok());
}

#[test]
fn completion_status_names() {
    assert_eq!(sys::wc_status_name(0), "IBV_WC_SUCCESS");
    assert_eq!(sys::wc_status_name(12), "IBV_WC_RETRY_EXC_ERR");
    assert_eq!(sys::wc_status_name(10), "IBV_WC_REM_ACCESS_ERR");
    assert_eq!(sys::wc_status_name(999), "unknown status");
}

#[test]
fn missing_library_is_a_typed_error() {
    // Where libibverbs is absent (CI), every entry point says so; where it is present but
    // has no device, device selection says that instead. Neither panics.
    match verbs::device_names(0) {
        // No library ("libibverbs.so.1 could not be loaded"), or a library without kernel
        // support ("ibv_get_device_list failed: Function not implemented").
        Err(Error::Transport {
            kind: TransportErrorKind::Unavailable,
            transport: Transport::Ib(0),
            detail,
            ..
        }) => assert!(!detail.is_empty()),
        Ok(names) => {
            let sel = select_device(&names, None, 0);
            assert!(names.is_empty() == sel.is_err());
        }
        Err(e) => panic!("{e}"),
    }
}
