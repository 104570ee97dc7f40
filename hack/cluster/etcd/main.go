// Command etcd is upstream etcd's server entry point, built from the Go module proxy because
// this machine has no release downloads (and Debian's etcd is too old).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
