int run_saxpy(int n);
int main() { return run_saxpy(1 << 20); }
