//! Round trips and refusals of every frame.

use super::*;

fn body(frame: &[u8]) -> &[u8] {
    &frame[CONTROL_HEADER_LEN..]
}

#[test]
fn control_frames_round_trip() {
    let v4: SocketAddr = "10.1.2.3:4567".parse().unwrap();
    let v6 = SocketAddr::V6(SocketAddrV6::new("fe80::1".parse().unwrap(), 80, 0, 3));
    let j = Join {
        tag: [7; 32],
        listen: v4,
        host_hash: 9,
        deadline_ms: 1000,
    };
    let f = j.encode();
    assert_eq!(f.len(), CONTROL_HEADER_LEN + JOIN_BODY_LEN);
    let h = ControlHeader::decode(f[..24].try_into().unwrap()).unwrap();
    assert_eq!(
        (h.kind, h.body_len as usize),
        (Kind::Join.code(), JOIN_BODY_LEN)
    );
    assert_eq!(Join::decode(body(&f)).unwrap(), j);
    assert_eq!(&body(&f)[32..], &j.request()[..]);

    let hello = Hello {
        magic: 5,
        purpose: Purpose::Link,
        from: 2,
        to: ROOT,
        size: 4,
        nonce: crate::auth::Nonce([3; 32]),
    };
    let f = hello.encode();
    assert_eq!(f.len(), CONTROL_HEADER_LEN + HELLO_BODY_LEN);
    assert_eq!(body(&f), &hello.body()[..]);
    assert_eq!(Hello::decode(body(&f)).unwrap(), hello);
    let mut bad = hello.body();
    bad[8] = 9; // purpose
    assert!(Hello::decode(&bad).is_err());
    let c = Challenge {
        nonce: crate::auth::Nonce([1; 32]),
        job: crate::auth::Nonce([5; 32]),
        tag: [2; 32],
    };
    assert_eq!(Challenge::decode(body(&c.encode())).unwrap(), c);
    assert_eq!(c.encode().len(), CONTROL_HEADER_LEN + CHALLENGE_BODY_LEN);
    let p = Proof { tag: [4; 32] };
    assert_eq!(Proof::decode(body(&p.encode())).unwrap(), p);
    assert_eq!(p.encode().len(), CONTROL_HEADER_LEN + PROOF_BODY_LEN);
    let n = Notice {
        rank: 3,
        reason: "y".repeat(1000),
    };
    let back = Notice::decode(&n.encode(), 4).unwrap();
    assert_eq!((back.rank, back.reason.len()), (3, MAX_REASON_LEN));
    assert!(Notice::decode(&n.encode(), 3).is_err(), "rank 3 of 3");
    assert!(n.encode().len() <= MAX_NOTICE_LEN);

    let t = Table {
        magic: 1,
        entries: vec![
            TableEntry {
                listen: v4,
                host_hash: 2,
            },
            TableEntry {
                listen: v6,
                host_hash: 3,
            },
        ],
    };
    assert_eq!(Table::decode(body(&t.encode()), 2).unwrap(), t);
    assert!(Table::decode(body(&t.encode()), 3).is_err());

    let a = Abort {
        code: AbortCode::RankLeft,
        ranks: vec![1, 3],
    };
    assert_eq!(Abort::decode(body(&a.encode()), 4).unwrap(), a);
    assert!(Abort::decode(body(&a.encode()), 3).is_err());

    let acc = Accept { magic: 5, rank: 1 };
    assert_eq!(Accept::decode(body(&acc.encode())).unwrap(), acc);
    let r = Reject {
        code: RejectCode::Version,
        reason: "x".repeat(1000),
    };
    let back = Reject::decode(body(&r.encode())).unwrap();
    assert_eq!(
        (back.code, back.reason.len()),
        (RejectCode::Version, MAX_REASON_LEN)
    );
}

#[test]
fn headers_reject_garbage() {
    let mut h = ControlHeader::new(Kind::Join, 56).encode();
    h[20] = 1;
    assert_eq!(ControlHeader::decode(&h), Err(HeaderError::Reserved));
    h[8] = 9;
    assert_eq!(ControlHeader::decode(&h), Err(HeaderError::Version(9)));
    h[0] = b'X';
    assert_eq!(ControlHeader::decode(&h), Err(HeaderError::BadMarker));

    let d = DataHeader {
        channel: CHANNEL_USER,
        tag: 3,
        len: MAX_DATA_LEN + 1,
    }
    .encode();
    assert!(DataHeader::decode(&d).is_err());
    let d = DataHeader {
        channel: 7,
        tag: 3,
        len: 1,
    }
    .encode();
    assert!(DataHeader::decode(&d).is_err());
    let d = DataHeader {
        channel: CHANNEL_COLLECTIVE,
        tag: 3,
        len: 1,
    }
    .encode();
    assert_eq!(DataHeader::decode(&d).unwrap().tag, 3);
    // A goodbye carries nothing: a tag or a payload makes it malformed.
    let bye = |tag, len| {
        DataHeader::decode(
            &DataHeader {
                channel: CHANNEL_GOODBYE,
                tag,
                len,
            }
            .encode(),
        )
    };
    assert!(bye(0, 0).is_ok());
    assert!(bye(1, 0).is_err());
    assert!(bye(0, 8).is_err());
    let notice = |tag, len: usize| {
        DataHeader::decode(
            &DataHeader {
                channel: CHANNEL_NOTICE,
                tag,
                len: len as u64,
            }
            .encode(),
        )
    };
    assert!(notice(0, MAX_NOTICE_LEN).is_ok());
    assert!(notice(1, 8).is_err());
    assert!(notice(0, MAX_NOTICE_LEN + 1).is_err());
}

#[test]
fn bodies_reject_truncation_and_padding() {
    let j = Join {
        tag: [0; 32],
        listen: "1.2.3.4:5".parse().unwrap(),
        host_hash: 0,
        deadline_ms: 0,
    }
    .encode();
    for cut in 0..JOIN_BODY_LEN {
        assert!(Join::decode(&body(&j)[..cut]).is_err());
    }
    let mut long = body(&j).to_vec();
    long.push(0);
    assert!(Join::decode(&long).is_err());
    let mut bad = body(&j).to_vec();
    bad[32] = 5; // address family
    assert!(Join::decode(&bad).is_err());
    let mut bad = body(&j).to_vec();
    bad[32 + 10] = 1; // IPv4 padding
    assert!(Join::decode(&bad).is_err());
}
