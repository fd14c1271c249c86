// Command modeldeploy-device-plugin makes the local cluster's real node advertise fake GPUs: a kubelet
// device plugin (API v1beta1) serving --devices healthy devices (fake-gpu-0, fake-gpu-1, ...) under
// --resource (nvidia.com/gpu). Allocate hands a container the one env var NVIDIA_VISIBLE_DEVICES=<ids>.
// It registers with the kubelet at <plugin-dir>/kubelet.sock, and again whenever the kubelet restarts
// (the kubelet recreates kubelet.sock and removes the plugins' sockets; both are polled), and exits 0
// on SIGTERM or SIGINT.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

var sourceHash = "dev" // set at build time (tools/build-binaries.sh)

type plugin struct {
	api.UnimplementedDevicePluginServer
	devices []*api.Device
	stop    chan struct{} // closed when this server stops: ends ListAndWatch streams
}

func (p *plugin) GetDevicePluginOptions(context.Context, *api.Empty) (*api.DevicePluginOptions, error) {
	return &api.DevicePluginOptions{}, nil
}

// ListAndWatch sends the devices, all healthy, once; they never change, so it then waits for the end.
func (p *plugin) ListAndWatch(_ *api.Empty, s grpc.ServerStreamingServer[api.ListAndWatchResponse]) error {
	if err := s.Send(&api.ListAndWatchResponse{Devices: p.devices}); err != nil {
		return err
	}
	select {
	case <-s.Context().Done():
	case <-p.stop:
	}
	return nil
}

func (p *plugin) Allocate(_ context.Context, req *api.AllocateRequest) (*api.AllocateResponse, error) {
	resp := &api.AllocateResponse{}
	for _, c := range req.ContainerRequests {
		resp.ContainerResponses = append(resp.ContainerResponses, &api.ContainerAllocateResponse{
			Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": strings.Join(c.DevicesIds, ",")},
		})
	}
	return resp, nil
}

func (p *plugin) GetPreferredAllocation(context.Context, *api.PreferredAllocationRequest) (*api.PreferredAllocationResponse, error) {
	return &api.PreferredAllocationResponse{}, nil
}

func (p *plugin) PreStartContainer(context.Context, *api.PreStartContainerRequest) (*api.PreStartContainerResponse, error) {
	return &api.PreStartContainerResponse{}, nil
}

// serve starts a gRPC server for the plugin on socket (replacing a stale one) and registers it with
// the kubelet. The caller stops the server (and closes p.stop) when it must start over.
func serve(p *plugin, socket, kubeletSocket, resource string) (*grpc.Server, error) {
	if err := os.Remove(socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	lis, err := net.Listen("unix", socket)
	if err != nil {
		return nil, err
	}
	srv := grpc.NewServer()
	api.RegisterDevicePluginServer(srv, p)
	go func() { _ = srv.Serve(lis) }()

	conn, err := grpc.NewClient("unix://"+kubeletSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err == nil {
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err = api.NewRegistrationClient(conn).Register(ctx, &api.RegisterRequest{
			Version:      api.Version,
			Endpoint:     filepath.Base(socket),
			ResourceName: resource,
		})
	}
	if err != nil {
		srv.Stop()
		return nil, fmt.Errorf("registering with the kubelet at %s: %w", kubeletSocket, err)
	}
	return srv, nil
}

// identity tells a recreated file from the one seen before (zero when it is missing).
func identity(path string) (id [2]uint64) {
	if fi, err := os.Stat(path); err == nil {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			id = [2]uint64{st.Ino, uint64(st.Ctim.Nano())}
		}
	}
	return id
}

type config struct {
	pluginDir, resource, socketName string
	devices                         int
	poll                            time.Duration
}

func main() {
	var c config
	flag.StringVar(&c.pluginDir, "plugin-dir", api.DevicePluginPath, "the kubelet's device-plugin directory (holding kubelet.sock)")
	flag.IntVar(&c.devices, "devices", 2, "how many fake devices to advertise")
	flag.StringVar(&c.resource, "resource", "nvidia.com/gpu", "the extended resource name to advertise")
	flag.StringVar(&c.socketName, "socket-name", "modeldeploy-gpu.sock", "this plugin's socket, in --plugin-dir")
	flag.DurationVar(&c.poll, "poll", time.Second, "how often to check for a restarted kubelet")
	flag.Parse()
	if flag.NArg() > 0 || c.devices < 0 {
		flag.Usage()
		os.Exit(2)
	}
	log.SetPrefix("modeldeploy-device-plugin: ")
	if dir, err := filepath.Abs(c.pluginDir); err == nil {
		c.pluginDir = dir // the kubelet's socket is dialled as unix://<absolute path>
	}
	log.Printf("source %s: %d devices as %s in %s", sourceHash, c.devices, c.resource, c.pluginDir)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	run(ctx, c)
	log.Print("stopped")
}

// run serves the plugin, registered with the kubelet whenever one is there, until ctx ends.
func run(ctx context.Context, c config) {
	var devs []*api.Device
	for i := range c.devices {
		devs = append(devs, &api.Device{ID: fmt.Sprintf("fake-gpu-%d", i), Health: api.Healthy})
	}
	kubeletSocket := filepath.Join(c.pluginDir, "kubelet.sock")
	socket := filepath.Join(c.pluginDir, c.socketName)
	ticker := time.NewTicker(c.poll)
	defer ticker.Stop()

	var srv *grpc.Server
	var p *plugin
	var registeredWith [2]uint64 // the kubelet.sock registered with
	stopServer := func() {
		if srv != nil {
			close(p.stop)
			srv.Stop()
			srv = nil
			_ = os.Remove(socket)
		}
	}
	defer stopServer()
	for {
		kubelet := identity(kubeletSocket)
		if srv != nil && (kubelet != registeredWith || identity(socket) == [2]uint64{}) {
			log.Printf("the kubelet restarted (or removed %s): registering again", socket)
			stopServer()
		}
		if srv == nil && kubelet != ([2]uint64{}) {
			p = &plugin{devices: devs, stop: make(chan struct{})}
			var err error
			if srv, err = serve(p, socket, kubeletSocket, c.resource); err != nil {
				log.Print(err) // tried again at the next poll
			} else {
				registeredWith = kubelet
				log.Printf("registered %s with the kubelet", socket)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}
