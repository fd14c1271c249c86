package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// fakeKubelet is the kubelet's Registration service on <dir>/kubelet.sock.
type fakeKubelet struct {
	api.UnimplementedRegistrationServer
	requests chan *api.RegisterRequest
	srv      *grpc.Server
}

func (k *fakeKubelet) Register(_ context.Context, r *api.RegisterRequest) (*api.Empty, error) {
	k.requests <- r
	return &api.Empty{}, nil
}

func startKubelet(t *testing.T, dir string, requests chan *api.RegisterRequest) *fakeKubelet {
	t.Helper()
	sock := filepath.Join(dir, "kubelet.sock")
	_ = os.Remove(sock)
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	k := &fakeKubelet{requests: requests, srv: grpc.NewServer()}
	api.RegisterRegistrationServer(k.srv, k)
	go func() { _ = k.srv.Serve(lis) }()
	return k
}

func registered(t *testing.T, requests chan *api.RegisterRequest) {
	t.Helper()
	select {
	case r := <-requests:
		if r.Version != api.Version || r.Endpoint != "test.sock" || r.ResourceName != "nvidia.com/gpu" {
			t.Fatalf("register request: %v", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no registration")
	}
}

func TestRegistersServesAndReregisters(t *testing.T) {
	dir, err := os.MkdirTemp("", "dp") // short: unix socket paths are limited to 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	requests := make(chan *api.RegisterRequest, 4)
	k := startKubelet(t, dir, requests)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		run(ctx, config{pluginDir: dir, resource: "nvidia.com/gpu", socketName: "test.sock", devices: 2, poll: 20 * time.Millisecond})
		close(done)
	}()
	registered(t, requests)

	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, "test.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := api.NewDevicePluginClient(conn)
	stream, err := client.ListAndWatch(ctx, &api.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Devices) != 2 || resp.Devices[0].ID != "fake-gpu-0" || resp.Devices[1].Health != api.Healthy {
		t.Fatalf("devices: %v", resp.Devices)
	}
	alloc, err := client.Allocate(ctx, &api.AllocateRequest{ContainerRequests: []*api.ContainerAllocateRequest{
		{DevicesIds: []string{"fake-gpu-0", "fake-gpu-1"}}}})
	if err != nil {
		t.Fatal(err)
	}
	envs := alloc.ContainerResponses[0].Envs
	if len(envs) != 1 || envs["NVIDIA_VISIBLE_DEVICES"] != "fake-gpu-0,fake-gpu-1" {
		t.Fatalf("envs: %v", envs)
	}

	// A kubelet restart: a new kubelet.sock, the plugin's socket removed.
	k.srv.Stop()
	_ = os.Remove(filepath.Join(dir, "test.sock"))
	k = startKubelet(t, dir, requests)
	defer k.srv.Stop()
	registered(t, requests)

	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return")
	}
	if _, err := os.Stat(filepath.Join(dir, "test.sock")); !os.IsNotExist(err) {
		t.Fatalf("socket left behind: %v", err)
	}
}
