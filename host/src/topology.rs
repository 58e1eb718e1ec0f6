//! `Topology`: the node layout every rank of a world shares — which ranks run on which node,
//! each rank's index among the ranks of its node (its *local index*), and the rank with the same
//! local index on every other node (its *column*, the peers of the network phase of a
//! hierarchical collective).
//!
//! It is computed from the bootstrap's host grouping ([`Bootstrap::node_of`]: ranks with the same
//! host identity, `MSCCLPP_HOSTID` or else host name and boot id, share a node). Every rank
//! derives it from the same table, so every rank holds the same layout. Nodes are numbered in
//! order of their lowest rank, and the ranks of a node in rank order (whatever numbering the
//! bootstrap uses), so that the layout does not depend on the bootstrap's implementation.
//!
//! ```
//! use mscclpp_host::topology::Topology;
//! // Ranks 0 and 2 on one host, 1 and 3 on another (a round-robin launcher).
//! let t = Topology::from_nodes(1, &[0, 1, 0, 1]).unwrap();
//! assert_eq!((t.nodes(), t.node(), t.local_index()), (2, 1, 0));
//! assert_eq!(t.ranks_on(0), &[0, 2]);
//! assert_eq!(t.column(), vec![0, 1]); // rank 1's column: local index 0 on each node
//! assert_eq!(t.uniform().unwrap(), 2);
//! ```
//!
//! Worlds with unequal numbers of ranks per node are valid; what needs equal nodes (the
//! hierarchical collectives) asks [`Topology::uniform`], which refuses them with
//! [`Error::UnevenNodes`] naming every node's size.

use crate::bootstrap::Bootstrap;
use crate::error::{Error, Result};

/// The node layout of a world, as one rank sees it (module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    rank: usize,
    /// Node of every rank.
    node_of: Vec<usize>,
    /// Local index of every rank.
    local_index: Vec<usize>,
    /// The ranks of every node, in rank order.
    members: Vec<Vec<usize>>,
}

impl Topology {
    /// The layout `bootstrap` knows, seen by its rank. Fails with [`Error::NoNodeLayout`] when
    /// the bootstrap cannot place a rank.
    pub fn from_bootstrap(bootstrap: &dyn Bootstrap) -> Result<Self> {
        let ids = (0..bootstrap.size())
            .map(|r| bootstrap.node_of(r).ok_or(Error::NoNodeLayout { rank: r }))
            .collect::<Result<Vec<_>>>()?;
        Self::from_nodes(bootstrap.rank(), &ids)
    }

    /// The layout where rank `r` runs on the node named `node_ids[r]` (any numbering: equal
    /// values share a node), seen by `rank`. Fails with [`Error::NoSuchRank`] when `rank` is not
    /// in the world.
    pub fn from_nodes(rank: usize, node_ids: &[usize]) -> Result<Self> {
        if rank >= node_ids.len() {
            return Err(Error::NoSuchRank {
                rank,
                size: node_ids.len(),
            });
        }
        let mut seen: Vec<usize> = Vec::new();
        let mut t = Self {
            rank,
            node_of: Vec::with_capacity(node_ids.len()),
            local_index: Vec::with_capacity(node_ids.len()),
            members: Vec::new(),
        };
        for (r, id) in node_ids.iter().enumerate() {
            let node = match seen.iter().position(|s| s == id) {
                Some(n) => n,
                None => {
                    seen.push(*id);
                    t.members.push(Vec::new());
                    seen.len() - 1
                }
            };
            t.local_index.push(t.members[node].len());
            t.members[node].push(r);
            t.node_of.push(node);
        }
        Ok(t)
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Ranks in the world.
    pub fn size(&self) -> usize {
        self.node_of.len()
    }

    /// Number of nodes.
    pub fn nodes(&self) -> usize {
        self.members.len()
    }

    /// This rank's node.
    pub fn node(&self) -> usize {
        self.node_of[self.rank]
    }

    /// The node of `rank` (`None` outside the world).
    pub fn node_of(&self, rank: usize) -> Option<usize> {
        self.node_of.get(rank).copied()
    }

    /// This rank's index among the ranks of its node.
    pub fn local_index(&self) -> usize {
        self.local_index[self.rank]
    }

    /// The local index of `rank` (`None` outside the world).
    pub fn local_index_of(&self, rank: usize) -> Option<usize> {
        self.local_index.get(rank).copied()
    }

    /// The ranks of `node`, in rank order (empty for a node that does not exist).
    pub fn ranks_on(&self, node: usize) -> &[usize] {
        self.members.get(node).map_or(&[], Vec::as_slice)
    }

    /// The ranks of this rank's node, in rank order (this rank included).
    pub fn local_ranks(&self) -> &[usize] {
        self.ranks_on(self.node())
    }

    /// Whether `rank` runs on this rank's node.
    pub fn same_node(&self, rank: usize) -> bool {
        self.node_of(rank) == Some(self.node())
    }

    /// The rank of `node` with local index `index`, if that node has so many ranks.
    pub fn rank_at(&self, node: usize, index: usize) -> Option<usize> {
        self.ranks_on(node).get(index).copied()
    }

    /// This rank's column: the rank with this rank's local index on every node that has one,
    /// in node order (this rank included). On uniform worlds it has one rank per node.
    pub fn column(&self) -> Vec<usize> {
        let l = self.local_index();
        (0..self.nodes())
            .filter_map(|n| self.rank_at(n, l))
            .collect()
    }

    /// Ranks of every node, in node order.
    pub fn node_sizes(&self) -> Vec<usize> {
        self.members.iter().map(Vec::len).collect()
    }

    /// The number of ranks per node when every node has the same number, else
    /// [`Error::UnevenNodes`] with every node's size.
    pub fn uniform(&self) -> Result<usize> {
        // Asked by every collective call: allocates only for the error.
        match self.members.first().map(Vec::len) {
            Some(l) if self.members.iter().all(|m| m.len() == l) => Ok(l),
            _ => Err(Error::UnevenNodes {
                sizes: self.node_sizes(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_are_numbered_by_lowest_rank() {
        // Node names as a launcher might give them (any numbering).
        let t = Topology::from_nodes(4, &[7, 3, 7, 3, 9]).unwrap();
        assert_eq!(t.nodes(), 3);
        assert_eq!((t.node(), t.local_index()), (2, 0));
        assert_eq!(t.ranks_on(0), &[0, 2]);
        assert_eq!(t.ranks_on(1), &[1, 3]);
        assert_eq!(t.ranks_on(2), &[4]);
        assert_eq!(t.ranks_on(3), &[] as &[usize]);
        assert_eq!(t.column(), vec![0, 1, 4]);
        assert_eq!(t.node_sizes(), vec![2, 2, 1]);
        match t.uniform() {
            Err(Error::UnevenNodes { sizes }) => assert_eq!(sizes, vec![2, 2, 1]),
            other => panic!("{other:?}"),
        }
        let t = Topology::from_nodes(3, &[7, 3, 7, 3, 9]).unwrap();
        assert_eq!(t.column(), vec![2, 3], "node 2 has no local index 1");
        assert!(t.same_node(1) && !t.same_node(0));
        assert_eq!(t.rank_at(1, 1), Some(3));
        assert_eq!(t.local_index_of(3), Some(1));
    }

    #[test]
    fn blocked_and_single_node_layouts() {
        for r in 0..8 {
            let t = Topology::from_nodes(r, &[0, 0, 0, 0, 1, 1, 1, 1]).unwrap();
            assert_eq!(t.uniform().unwrap(), 4);
            assert_eq!(t.column(), vec![r % 4, 4 + r % 4]);
            assert_eq!(t.local_ranks().len(), 4);
        }
        let one = Topology::from_nodes(2, &[5, 5, 5]).unwrap();
        assert_eq!((one.nodes(), one.uniform().unwrap()), (1, 3));
        assert_eq!(one.column(), vec![2]);
        assert!(matches!(
            Topology::from_nodes(3, &[0, 0, 0]),
            Err(Error::NoSuchRank { rank: 3, size: 3 })
        ));
    }
}
